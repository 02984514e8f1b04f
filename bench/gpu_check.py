"""The device check for a machine with CUDA cards: the tree places the demo models on
gpu0 (bf16), serves chat streamed and not, survives kill -9 of the card's actor, and
leaves no process after SIGTERM. Prints one line per check; exits non-zero on failure.

Then the throughput runs (the fixed-shape path, auto on CUDA), through HTTP on a server of their
own (continuous batching on, the demo SAE attached), one JSON line each with the issue's goal:
one greedy stream's tok/s, `--streams` streams arriving `--stagger-ms` apart (default sampling:
batched) in aggregate tok/s, and each again with steering on (the ratio: ≤ 3 % loss).

    python bench/gpu_check.py                  (then: python bench/stream_overhead.py --size 1b)
    python bench/gpu_check.py --throughput     the throughput runs only
    python bench/gpu_check.py --throughput --size tiny --streams 8 --fixed-shape on   a CPU dry run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402
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


def checks() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = Path(tempfile.mkdtemp()) / "gpu.toml"
    cfg.write_text("defaults = false\n" + CONFIG)  # the server is this file alone, not over default.toml
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


def measure(name: str, value: float, goal: str, met: bool | None) -> None:
    """A throughput figure beside its goal (met: None where the goal is not this machine's)."""
    print(json.dumps({"measure": name, "value": round(value, 3), "goal": goal, "met": met}), flush=True)


def stream(
    http: httpx.Client, url: str, model: str, tokens: int, greedy: bool, delay: float = 0.0
) -> tuple[int, float, float]:
    """One streamed chat after `delay` s: (completion tokens, its start, its end) in perf_counter time."""
    time.sleep(delay)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"temperature": 0} if greedy else {}),
    }
    start, n = time.perf_counter(), 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                n = (json.loads(line[6:]).get("usage") or {}).get("completion_tokens", n)
    return n, start, time.perf_counter()


def throughput(args) -> None:
    on_card = ACTOR.startswith("gpu")
    model = f"throughput-{args.size}"  # its own name: the steering store keeps what a model had attached
    proc, url = start_server(
        f'log_level = "warning"\nollama_port = 0\nnpu_actors = []\ncontinuous_batching = true\n'
        f'fixed_shape = "{args.fixed_shape}"\nfixed_shape_slots = {args.streams}\n'
        f'[[models]]\nid = "{model}"\nsource = "demo:{args.size}"\n'
    )
    http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=args.streams + 8))
    try:
        r = http.post(url + "/api/saes/attach", json={"model": model, "sae": f"demo:{args.size}"})
        assert r.status_code == 200, r.text
        sae_id = next(m for m in http.get(url + "/api/saes").json()["models"] if m["model"] == model)["saes"][0][
            "sae_id"
        ]

        def steer(on: bool) -> None:
            strengths = {sae_id: {"5": 60.0, "9": -30.0}} if on else {}
            r = http.put(url + "/api/steering", json={"model": model, "enabled": True, "strengths": strengths})
            assert r.status_code == 200, r.text

        def one() -> float:
            n, start, end = stream(http, url, model, args.tokens, greedy=True)
            return n / (end - start)

        def many() -> float:
            with ThreadPoolExecutor(args.streams) as pool:
                runs = list(
                    pool.map(
                        lambda i: stream(http, url, model, args.tokens, False, i * args.stagger_ms / 1000),
                        range(args.streams),
                    )
                )
            return sum(n for n, _, _ in runs) / (max(e for _, _, e in runs) - min(s for _, s, _ in runs))

        for on in (False, True):  # warm both paths and both steering states (compiles, CUDA graphs)
            steer(on)
            one(), many()
        figures = {(on, kind): [] for on in (False, True) for kind in ("one", "many")}
        for _ in range(args.runs):  # interleaved: drift hits both alike
            for on in (False, True):
                steer(on)
                figures[(on, "one")].append(one())
                figures[(on, "many")].append(many())
        med = {key: statistics.median(values) for key, values in figures.items()}
        label = f"demo:{args.size} on {ACTOR}, fixed_shape={args.fixed_shape}"
        measure(
            f"{label}: one stream tok/s",
            med[(False, "one")],
            ">= 350 (H200, 1b)",
            med[(False, "one")] >= 350 if on_card else None,
        )
        measure(
            f"{label}: {args.streams} staggered streams tok/s",
            med[(False, "many")],
            ">= 10000 (H200, 1b, 64 streams)",
            med[(False, "many")] >= 10_000 if on_card else None,
        )
        for kind in ("one", "many"):
            ratio = med[(True, kind)] / med[(False, kind)]
            measure(
                f"{label}: steering on / off, {kind} stream(s)", ratio, ">= 0.97", ratio >= 0.97 if on_card else None
            )
        steer(False)  # the store keeps the model's steering: leave it unsteered, the SAE detached
        http.post(url + "/api/saes/detach", json={"model": model, "sae_id": sae_id})
    finally:
        http.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--throughput", action="store_true", help="the throughput runs only")
    ap.add_argument("--size", default="1b")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--stagger-ms", type=float, default=20.0, help="between two streams' arrivals")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fixed-shape", default="auto", choices=("auto", "on", "off"))
    args = ap.parse_args()
    if not args.throughput:
        checks()
    throughput(args)


if __name__ == "__main__":
    main()
