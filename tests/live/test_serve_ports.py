"""`greenroom serve` also listens on Ollama's port, so the Ollama CLI and clients need no
OLLAMA_HOST — unless that port is taken, when it says so and serves on its own port. Its own
port taken stops the start."""

import os
import socket
import subprocess
import sys

import httpx
import ollama
from conftest import MODEL, ROOT, free_port


def test_ollama_port_is_served_too(own_server):
    port = free_port()
    srv = own_server(extra_env={"GREENROOM_OLLAMA_PORT": str(port)})
    client = ollama.Client(host=f"http://127.0.0.1:{port}")
    assert MODEL in [m.model for m in client.list().models]
    assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "ok"
    assert srv.url != f"http://127.0.0.1:{port}"


def test_taken_ollama_port_is_skipped_with_a_warning(own_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = own_server(extra_env={"GREENROOM_OLLAMA_PORT": str(port)})
        assert httpx.get(srv.url + "/api/version").status_code == 200
        assert f"not listening on Ollama's port {port}" in srv.log()


def test_a_taken_port_stops_the_start_with_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "greenroom", "serve", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "GREENROOM_OLLAMA_PORT": "0", "GREENROOM_CACHE": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert f"greenroom: cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
