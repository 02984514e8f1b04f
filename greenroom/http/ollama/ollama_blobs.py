"""Ollama's blob routes: what `ollama create` uploads before it names the files in
`/api/create`'s `files` (store/blobs.py keeps them).

- `HEAD /api/blobs/sha256:<hex>`: 200 when the blob is stored, 404 when not (older CLIs ask
  before uploading).
- `POST /api/blobs/sha256:<hex>`: 200 without reading the body when the blob is stored
  already; else the body is streamed to a temporary file (never whole in memory: the
  exchange is paced, http/core/connection.py), hashed as it comes, and stored under its digest:
  201. Its bytes hashing to another digest is 400 `digest_mismatch` (Ollama's words), a
  malformed digest 400, a body past `max_blob_bytes` 413 — by its Content-Length before a
  byte is read, else as the bytes pass the limit; a body with no byte for BODY_TIMEOUT is
  408. An upload is not held to `request_timeout_s` (it cannot answer before its body is in).

Ollama's CLI sends the file chunked (no Content-Length) with `Content-Type: application/json`;
the Python client sends it with its length. Both are read as bytes, whatever the type says.
"""

from __future__ import annotations

import trio
from quart import Quart, request

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, routes
from greenroom.http.core.connection import Paced
from greenroom.store import blobs

DIGEST = contracts.Text(
    pattern=blobs.DIGEST.pattern,
    description="sha256:<the 64 hex digits of the file's sha256> (sha256-<hex> too, as Ollama reads it)",
    examples=("sha256:" + "0" * 64,),
)


def register(app: Quart, store: blobs.BlobStore) -> None:

    @routes.view(app, "HEAD", "/api/blobs/{digest}")
    async def ollama_has_blob(digest: str):
        if not await trio.to_thread.run_sync(store.has, digest):
            raise GreenroomError("not_found", f'blob "{digest}" not found', "digest")
        return "", 200

    @routes.view(app, "POST", "/api/blobs/{digest}")
    async def ollama_create_blob(digest: str):
        if await trio.to_thread.run_sync(store.has, digest):
            return "", 200  # Ollama's answer: the body is not read (connection.py drains or closes)
        upload = store.upload(digest, request.content_length)  # no await before the `try` that discards it
        try:
            chunks = Paced(request.scope, request.body)
            while True:
                with trio.move_on_after(request.body_timeout) as idle:
                    chunk = await anext(chunks, None)
                if idle.cancelled_caught:
                    raise GreenroomError(
                        "body_timeout", f"no byte of the blob came for {request.body_timeout:g} s", "digest"
                    )
                if chunk is None:
                    break
                await trio.to_thread.run_sync(upload.write, chunk)
            await trio.to_thread.run_sync(upload.commit)
        finally:
            upload.discard()  # what is left of the temporary file (nothing once committed)
        return "", 201
