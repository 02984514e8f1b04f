"""A Hugging Face Hub on loopback, for pull tests (the real Hub is unreachable here): the
part of the Hub's file API huggingface_hub uses to list and download a model repository.

- `GET /api/models/{owner}/{name}[/revision/{rev}]` → the repository's info: `sha`,
  `private`, `siblings` (with `size`, `blobId`, and `lfs` for weight files).
- `HEAD` and `GET /{owner}/{name}/resolve/{rev}/{file}` → the file, with the headers
  huggingface_hub reads: X-Repo-Commit, ETag, Content-Length, and for LFS files
  X-Linked-Etag and X-Linked-Size.

A file can be made to fail its download (500). A private repository answers 401
(X-Error-Code: RepoNotFound, as the Hub does for a private repository) unless the request
carries `Authorization: Bearer <its token>`. Every request's path and Authorization header
are recorded in `requests`. The server runs in a daemon thread and stops when its `with`
block ends.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".gguf")


class Repo:
    def __init__(self, files: dict[str, bytes], token: str | None = None, failing: tuple[str, ...] = ()):
        self.files = files
        self.token = token  # None: public
        self.failing = failing  # files whose download (GET) answers 500
        self.sha = hashlib.sha1(b"".join(hashlib.sha256(files[n]).digest() for n in sorted(files))).hexdigest()

    @classmethod
    def from_dir(cls, path: Path, token: str | None = None, only: tuple[str, ...] = ()) -> Repo:
        return cls(
            {
                p.name: p.read_bytes()
                for p in sorted(Path(path).iterdir())
                if p.is_file() and (not only or p.name.endswith(only))
            },
            token,
        )

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        out = {"rfilename": name, "size": len(data), "blobId": _git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            out["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_INFO = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class FakeHub:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the test reads `requests`
                pass

            def do_GET(self):
                hub._answer(self, body=True)

            def do_HEAD(self):
                hub._answer(self, body=False)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, h: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        auth = h.headers.get("Authorization")
        self.requests.append((h.command, path, auth))
        if m := _INFO.match(path):
            repo = self._allowed(h, m.group(1), auth)
            if repo is None:
                return
            if m.group(2) not in (None, "main", repo.sha):
                return _send(h, 404, {"error": "Revision Not Found"}, {"X-Error-Code": "RevisionNotFound"}, body)
            info = {
                "id": m.group(1),
                "modelId": m.group(1),
                "sha": repo.sha,
                "private": repo.token is not None,
                "gated": False,
                "disabled": False,
                "tags": [],
                "siblings": [repo.sibling(n) for n in sorted(repo.files)],
            }
            return _send(h, 200, info, {}, body)
        if m := _RESOLVE.match(path):
            repo = self._allowed(h, m.group(1), auth)
            if repo is None:
                return
            name = m.group(3)
            if name not in repo.files:
                return _send(h, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}, body)
            if body and name in repo.failing:
                return _send(h, 500, {"error": "Internal Error"}, {}, body)
            data = repo.files[name]
            sibling = repo.sibling(name)
            headers = {
                "X-Repo-Commit": repo.sha,
                "ETag": f'"{sibling["blobId"]}"',
                "Content-Type": "application/octet-stream",
            }
            if "lfs" in sibling:
                headers.update({"X-Linked-Etag": f'"{sibling["lfs"]["sha256"]}"', "X-Linked-Size": str(len(data))})
            return _send_bytes(h, data, headers, body)
        _send(h, 404, {"error": "not found"}, {}, body)

    def _allowed(self, h, repo_id: str, auth: str | None) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.token is not None and auth != f"Bearer {repo.token}"):
            _send(h, 401, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, h.command == "GET")
            return None
        return repo


def _send(h, status: int, obj: dict, headers: dict, body: bool) -> None:
    data = json.dumps(obj).encode()
    h.send_response(status)
    for k, v in {"Content-Type": "application/json", **headers}.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if body:
        h.wfile.write(data)


def _send_bytes(h, data: bytes, headers: dict, body: bool) -> None:
    h.send_response(200)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if body:
        h.wfile.write(data)


# --- the repositories the pull tests serve ------------------------------------------------------

PUBLIC = "acme/tiny"  # the demo checkpoint (safetensors): a transformers model
PRIVATE = "acme/secret"  # the same checkpoint, private
GGUF = "acme/tiny-gguf"  # the demo model as GGUF, Q8_0 and Q4_0: llama.cpp models
BARE = "acme/readme-only"  # nothing greenroom can serve
BROKEN = "acme/broken"  # the demo checkpoint, whose weights fail to download
PRIVATE_TOKEN = "hf_private_token_0123456789"


def demo_repos(model_cache: Path) -> dict[str, Repo]:
    """The repositories above, made by the project's own generators."""
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model

    cache = default_cache_dir(model_cache)
    checkpoint = ensure_demo_model(cache, "tiny")
    gguf_dir = ensure_demo_gguf(cache, "Q8_0").parent
    return {
        PUBLIC: Repo.from_dir(checkpoint),
        PRIVATE: Repo.from_dir(checkpoint, token=PRIVATE_TOKEN),
        GGUF: Repo({p.name: p.read_bytes() for p in sorted(gguf_dir.glob("*.gguf")) if "F16" not in p.name}),
        BARE: Repo({"README.md": b"# nothing to serve\n"}),
        BROKEN: Repo(Repo.from_dir(checkpoint).files, failing=("model.safetensors",)),
    }


def server_cache(tmp: Path, model_cache: Path) -> Path:
    """A cache root of a test's own (its registry, steering state and pulled files stay out of
    the session's), holding the session's generated demo models through links instead of
    building them again."""
    from greenroom.engines.demo.demo_model import default_cache_dir

    root = tmp / "cache"
    models = default_cache_dir(root)
    models.mkdir(parents=True)
    for shared in default_cache_dir(model_cache).iterdir():
        if shared.is_dir() and not shared.name.startswith(".") and shared.name not in ("hub", "blobs"):
            (models / shared.name).symlink_to(shared, target_is_directory=True)
    return root


# only the transformers demo model: no GGUF actor starts unless a test pulls one
CONFIG = """
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
"""
