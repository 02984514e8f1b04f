"""Cross-origin requests from browser front ends, by Ollama's rules.

A request that carries an `Origin` is a browser's: it is served only when the origin is
allowed — Ollama's defaults (http(s)://localhost, 127.0.0.1 and 0.0.0.0 on any port, app://,
file://, tauri://, vscode-webview://, vscode-file:// and browser extensions) plus the
configured `cors_origins` and OLLAMA_ORIGINS / GREENROOM_ORIGINS (comma-separated, `*`
wildcards, `*` alone: any origin). Anything else is a 403, before any work, as Ollama
answers it: a page on another site cannot drive a workstation's models. A preflight
(`OPTIONS` with `Access-Control-Request-Method`) is answered here, before the API key is
checked — browsers never send credentials on a preflight. Requests without `Origin`
(SDKs, curl) are not concerned.
"""

from __future__ import annotations

import fnmatch
import os

from greenroom.errors import GreenroomError

_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
DEFAULT_ORIGINS = (
    *(f"{scheme}://{host}{port}" for host in _HOSTS for scheme in ("http", "https") for port in ("", ":*")),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
    # gin-contrib/cors' AllowBrowserExtensions, which Ollama turns on
    "chrome-extension://*",
    "safari-extension://*",
    "moz-extension://*",
    "ms-browser-extension://*",
)
ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
MAX_AGE_S = 12 * 3600  # gin-contrib/cors' default


class Origins:
    """The allowed origins: patterns matched case-insensitively, `*` matching any run."""

    def __init__(self, configured: list[str]):
        extra = [o for var in ("OLLAMA_ORIGINS", "GREENROOM_ORIGINS") for o in os.environ.get(var, "").split(",")]
        self.patterns = tuple(p.strip().lower() for p in (*DEFAULT_ORIGINS, *configured, *extra) if p.strip())

    def allows(self, origin: str) -> bool:
        origin = origin.strip().lower()
        return any(fnmatch.fnmatchcase(origin, p) for p in self.patterns)

    def check(self, origin: str | None) -> None:
        if origin is not None and not self.allows(origin):
            raise GreenroomError(
                "origin_not_allowed",
                f"origin {origin!r} is not allowed: add it to cors_origins "
                "or OLLAMA_ORIGINS (comma-separated, * wildcards)",
            )


def preflight_headers(origin: str, requested_headers: str | None) -> dict[str, str]:
    return {
        **response_headers(origin),
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": requested_headers or "Authorization, Content-Type",
        "Access-Control-Max-Age": str(MAX_AGE_S),
    }


def response_headers(origin: str) -> dict[str, str]:
    # every header greenroom sends (http/core/headers.py names them) is for the page to read too
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": "*", "Vary": "Origin"}
