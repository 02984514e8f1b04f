"""The steering console: a web page at /ui/ (docs/console.md), the files in `static/` served as
they are — plain JS, no build step, no library. The page uses only the public API, as any
client does: it asks for the API key and sends it (the page's own files are open, like `/` and
`/health`: they hold nothing but code), and its requests meet the CORS rules like any other.

The files are read once when the app is made; each answer carries a strict Content-Security-Policy
(scripts, styles and requests from this origin only: no inline code) and `no-cache` with an ETag,
so a browser revalidates and an upgraded server's page is never stale."""

from __future__ import annotations

import hashlib
from pathlib import Path

from quart import Quart, Response, request

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, headers, routes

PREFIX = "/ui/"
_FOLDER = Path(__file__).parent / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
MEDIA_TYPES = tuple(_TYPES.values())  # what the OpenAPI document says its answers are
FILES = tuple(sorted(p.name for p in _FOLDER.iterdir() if p.suffix in _TYPES and p.name != "index.html"))
FILE = contracts.Choice(values=FILES, description="one of the console's files")
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    headers.NOSNIFF_HEADER: "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def register(app: Quart) -> None:
    served = {name: (_FOLDER / name).read_bytes() for name in ("index.html", *FILES)}

    def answer(name: str) -> Response:
        body = served[name]
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        headers = {**HEADERS, "ETag": etag}
        if request.headers.get("If-None-Match") == etag:
            return Response(b"", 304, headers)
        media = _TYPES[Path(name).suffix] + "; charset=utf-8"
        return Response(body, 200, headers, content_type=media)

    @routes.view(app, "GET", "/ui/")
    async def page():
        return answer("index.html")

    @routes.view(app, "GET", "/ui/{file}")
    async def file(file: str):
        if file not in FILES:
            raise GreenroomError("unknown_url", f"the console has no file {file!r} (it has {', '.join(FILES)})")
        return answer(file)
