"""The device check for a machine with CUDA cards: the tree places the demo models on
gpu0 (bf16), serves chat streamed and not, survives kill -9 of the card's actor, and
leaves no process after SIGTERM. Prints one line per check; exits non-zero on failure.

    python bench/gpu_check.py        (then: python bench/stream_overhead.py --size 1b)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greenroom.config import detect_engine_actors  # noqa: E402

ACTOR = detect_engine_actors()[0]  # gpu0 on a CUDA machine; cpu elsewhere (a dry run)
CONFIG = """
log_level = "warning"
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
[[models]]
id = "greenroom-demo-1b"
source = "demo:1b"
"""


def check(name: str, ok: bool, **figures) -> None:
    print(json.dumps({"check": name, "ok": bool(ok), **figures}), flush=True)
    if not ok:
        raise SystemExit(1)


def chat(http, url, model, stream=False, **kw):
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}], "stream": stream, **kw}
    return http.post(url + "/v1/chat/completions", json=body)


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Path(tempfile.mkdtemp()) / "gpu.toml"
    cfg.write_text(CONFIG)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenroom", "serve", "--port", str(port), "--config", str(cfg)], cwd=ROOT
    )
    http = httpx.Client(timeout=300)
    try:
        while True:
            try:
                if http.get(url + "/health").json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > 400:
                check("serve", False, returncode=proc.poll())
            time.sleep(0.5)
        actors = {a["name"]: a for a in http.get(url + "/api/actors").json()["actors"]}
        check(
            "tree",
            ACTOR in actors
            and actors[ACTOR]["state"] == "ready"
            and actors[ACTOR]["pid"] != actors["supervisor"]["pid"],
            startup_s=round(time.monotonic() - t0, 1),
            actors={k: [v["pid"], v["state"], v["models"]] for k, v in actors.items()},
        )
        for model in ("greenroom-demo", "greenroom-demo-1b"):
            r = chat(http, url, model, max_tokens=32, temperature=0)
            check(
                f"chat {model}",
                r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 32,
                text=r.json()["choices"][0]["message"]["content"][:60] if r.status_code == 200 else r.text,
            )
        a, b = (
            chat(http, url, "greenroom-demo-1b", max_tokens=24, seed=5).json()["choices"][0]["message"]["content"]
            for _ in range(2)
        )
        check("seed repeats", a == b)
        body = {
            "model": "greenroom-demo-1b",
            "messages": [{"role": "user", "content": "Go"}],
            "max_tokens": 3000,
            "stream": True,
        }
        gpu_pid, killed, error = actors[ACTOR]["pid"], None, None
        with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            n = 0
            for line in r.iter_lines():
                n += line.startswith("data: {")
                if n == 20 and killed is None:
                    os.kill(gpu_pid, signal.SIGKILL)
                    killed = time.monotonic()
                if '"error"' in line:
                    error = json.loads(line[6:])["error"]["code"], round(time.monotonic() - killed, 3)
        check(
            f"kill -9 {ACTOR} mid-stream → error event",
            error is not None and error[0] == "engine_crashed" and error[1] < 2,
            error=error,
        )
        t = time.monotonic()
        r = chat(http, url, "greenroom-demo-1b", max_tokens=8)
        actors = {a["name"]: a for a in http.get(url + "/api/actors").json()["actors"]}
        check(
            "restart, next request served",
            r.status_code == 200 and actors[ACTOR]["pid"] != gpu_pid,
            wait_s=round(time.monotonic() - t, 1),
            restarts=actors[ACTOR]["restarts"],
        )
        pids = [a["pid"] for a in actors.values()]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    time.sleep(2)
    check("SIGTERM leaves no process", not [p for p in pids if Path(f"/proc/{p}").exists()], pids=pids)


if __name__ == "__main__":
    main()
