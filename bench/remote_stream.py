"""A remote actor's stream against a local one: the same model on the main host's `cpu` actor
and on a worker host's (`greenroom worker`, its actors on 127.0.0.2, joined over the TLS
link), one stream at a time, greedy, interleaved. Prints, for each, tokens/s, the median gap
between tokens as the client receives them and its 90th percentile, and the time to the
first token; then what the worker link adds: to the gap between tokens, and to a one-token
request's round trip (half of it is what each decode step's message pays one way).

    .venv/bin/python bench/remote_stream.py [--size tiny|100m] [--tokens N] [--runs R]

Both "hosts" share this machine's cores: the link's cost (TLS both ways, a splice in each
process) competes with the decode itself, as it would not on two machines."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def stream(http: httpx.Client, url: str, model: str, tokens: int) -> dict:
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    start = time.perf_counter()
    arrivals, n = [], 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {
        "tokens": n,
        "tps": (n - 1) / (arrivals[-1] - arrivals[0]),
        "gap_p50": statistics.median(gaps),
        "gap_p90": statistics.quantiles(gaps, n=10)[-1],
        "ttft": arrivals[0] - start,
    }


def round_trip(http: httpx.Client, url: str, model: str) -> float:
    """One request of one token, not streamed: the request's way down and its events' way up."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    http.post(url + "/v1/chat/completions", json=body).raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listen = s.getsockname()[1]
    token = secrets.token_hex(32)
    os.environ["GREENROOM_WORKER_TOKEN"] = token  # the server and the worker inherit it
    proc, url = start_server(
        f'log_level = "warning"\nollama_port = 0\nengine_actors = ["cpu"]\nnpu_actors = []\n'
        f'workers_listen = "127.0.0.1:{listen}"\n'
        f'[[models]]\nid = "local"\nsource = "demo:{args.size}"\nactor = "cpu"\n'
        f'[[models]]\nid = "remote"\nsource = "demo:{args.size}"\nactor = "hostb/cpu"\n'
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "greenroom", "worker", "--join", f"127.0.0.1:{listen}", "--name", "hostb"]
        + ["--actors", "cpu", "--bind", "127.0.0.2", "--log-level", "warning"],
        cwd=ROOT,
    )
    try:
        with httpx.Client(timeout=600) as http:
            deadline = time.monotonic() + 300
            while http.post(url + "/api/models/load", json={"model": "remote"}).status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("the worker host did not join")
                time.sleep(0.5)
            stream(http, url, "local", args.tokens), stream(http, url, "remote", args.tokens)  # warm both
            local, remote, rt_local, rt_remote = [], [], [], []
            for _ in range(args.runs):  # interleaved, so drift hits both alike
                local.append(stream(http, url, "local", args.tokens))
                remote.append(stream(http, url, "remote", args.tokens))
            for _ in range(50):
                rt_local.append(round_trip(http, url, "local"))
                rt_remote.append(round_trip(http, url, "remote"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        worker.wait(30)

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    assert {r["tokens"] for r in local} == {r["tokens"] for r in remote}, "both must generate the same tokens"
    print(f"model demo:{args.size} on cpu, {local[0]['tokens']} tokens, one stream, median of {args.runs} runs")
    for name, rows in (("local actor ", local), ("remote actor", remote)):
        print(
            f"{name}: {med(rows, 'tps'):7.1f} tok/s   gap p50 {med(rows, 'gap_p50') * 1000:6.2f} ms   "
            f"p90 {med(rows, 'gap_p90') * 1000:6.2f} ms   TTFT {med(rows, 'ttft') * 1000:7.1f} ms"
        )
    rt = (statistics.median(rt_remote) - statistics.median(rt_local)) * 1000
    print(
        f"one-token requests (50 each): local {statistics.median(rt_local) * 1000:.1f} ms, remote "
        f"{statistics.median(rt_remote) * 1000:.1f} ms: the link adds {rt:+.1f} ms a round trip, "
        f"~{rt / 2:+.1f} ms to each message one way (each decode step's message crosses it once)"
    )
    added = (med(remote, "gap_p50") - med(local, "gap_p50")) * 1000
    print(
        f"the worker link adds {added:+.2f} ms per token (p50 gap), "
        f"{(med(remote, 'ttft') - med(local, 'ttft')) * 1000:+.1f} ms to the first; "
        f"tokens/s remote/local {med(remote, 'tps') / med(local, 'tps'):.3f}"
    )


if __name__ == "__main__":
    main()
