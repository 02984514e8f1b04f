"""Uploaded files, stored by the sha256 of their bytes: what Ollama's CLI sends to
`POST /api/blobs/sha256:<hex>` before `ollama create` names them in `files`
(http/ollama/ollama_blobs.py, http/ollama/ollama_models.py).

A blob is `<cache>/models/blobs/sha256-<hex>`, as Ollama names its own. An upload is written
to a temporary file beside it (`sha256-<hex>-<random>-partial`), hashed as it is written,
flushed to disk, and renamed into place only when its digest is the one it was sent under: a
blob present is always whole and always what its name says. Two uploads of one digest at once
write two temporary files and rename the same bytes onto one name, one after the other. A
blob goes when the last created model that serves it is deleted (http/ollama/ollama_models.py), and
at startup what no model is made from goes (`prune`).
No quart or trio here: the routes call these from worker threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.errors import GreenroomError

# Ollama's: `sha256:` (a manifest's spelling) or `sha256-` (a file name's), 64 hex digits
DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


def hex_of(digest) -> str:
    """The lower-case hex of a digest Ollama would accept, or 400 as Ollama words it."""
    m = DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise GreenroomError("invalid_parameter", "invalid digest format", "digest")
    return m.group(1).lower()


class BlobStore:
    def __init__(self, cache_dir: str | None, max_bytes: int):
        self.dir = default_cache_dir(cache_dir) / "blobs"
        self.max_bytes = max_bytes

    def path(self, digest: str) -> Path:
        return self.dir / f"sha256-{hex_of(digest)}"

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def holds(self, path: str | Path) -> bool:
        """Whether `path` is a blob of this store (a model's source made from one)."""
        path = Path(path)
        return path.parent == self.dir and DIGEST.fullmatch(path.name) is not None

    def upload(self, digest: str, declared: int | None) -> Upload:
        """A new upload of `digest`; `declared`: the body's Content-Length, when it has one —
        past the limit, or past the disk's free space, it is refused before a byte is read."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if declared is not None:
            self._check_size(declared)
            free = shutil.disk_usage(self.dir).free
            if declared > free:
                raise GreenroomError(
                    "storage_unavailable",
                    f"the blob is {declared} bytes and the disk holding {self.dir} has {free} free",
                    "digest",
                )
        return Upload(self, hex_of(digest))

    def remove(self, path: str | Path) -> None:
        """Delete a blob (never anything outside the store)."""
        if not self.holds(path):
            raise ValueError(f"refusing to delete {path}: not a blob of {self.dir}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def prune(self, used: set[str]) -> list[str]:
        """At startup, as Ollama prunes its layers: what no model is made from — an upload a
        killed server left partial, a blob uploaded but never created from (a CLI uploads again
        before it creates) — is deleted. The names deleted."""
        if not self.dir.is_dir():
            return []
        gone = []
        for path in self.dir.iterdir():
            if path.is_file() and (path.name.endswith("-partial") or (self.holds(path) and str(path) not in used)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                gone.append(path.name)
        return gone

    def _check_size(self, size: int) -> None:
        if size > self.max_bytes:
            raise GreenroomError(
                "request_too_large",
                f"the blob is larger than the server's limit of {self.max_bytes} bytes (max_blob_bytes)",
                "digest",
            )


class Upload:
    """One upload's temporary file, hashed as it is written; `commit` puts it in place,
    `discard` (always called, last) removes what is left of it."""

    def __init__(self, store: BlobStore, hex_digest: str):
        self.store, self.hex = store, hex_digest
        fd, name = tempfile.mkstemp(dir=store.dir, prefix=f"sha256-{hex_digest}-", suffix="-partial")
        self._file = os.fdopen(fd, "wb")
        self._temp = Path(name)
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self.store._check_size(self.size)
        self._sha.update(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            raise _unwritable(self.store.dir, exc) from None

    def commit(self) -> None:
        """Verify the digest, then flush the file to disk and rename it onto the blob's name."""
        got = self._sha.hexdigest()
        if got != self.hex:
            raise GreenroomError(
                "digest_mismatch", f'digest mismatch, expected "sha256:{self.hex}", got "sha256:{got}"', "digest"
            )
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._temp, 0o644)
            os.replace(self._temp, self.store.dir / f"sha256-{self.hex}")
        except OSError as exc:
            raise _unwritable(self.store.dir, exc) from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


def _unwritable(where: Path, exc: OSError) -> GreenroomError:
    return GreenroomError("storage_unavailable", f"the blob could not be written to {where}: {exc.strerror}", "digest")
