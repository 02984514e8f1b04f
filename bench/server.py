"""Start a `greenroom serve` of the benches' own on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def start_server(config: str, timeout_s: float = 400) -> tuple[subprocess.Popen, str]:
    """`config`: the TOML text. Returns the process and its URL once /health says ok."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Path(tempfile.mkdtemp()) / "bench.toml"
    cfg.write_text("defaults = false\n" + config)  # the server is this file alone, not over default.toml
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenroom", "serve", "--port", str(port), "--config", str(cfg)], cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).json()["status"] == "ok":
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server did not become healthy (exit code {proc.poll()})")
