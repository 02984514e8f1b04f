"""Aggregate throughput under concurrency: N streams at once against `greenroom serve`
(N = 1, 4, 16, 64), tokens/s summed over all of them, printed as a ratio to one stream.
Also the time to first token seen by the slowest stream. Today every engine actor
decodes one sequence at a time (the serial path), so the ratio shows what queueing
alone gives; continuous batching (issue 8) is to be measured against this baseline.

    .venv/bin/python bench/concurrency.py [--size tiny|100m] [--tokens N] [--levels 1,4,16,64]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402


def one_stream(url: str, tokens: int, i: int) -> tuple[int, float]:
    body = {"model": "bench", "messages": [{"role": "user", "content": f"Story number {i}"}],
            "max_tokens": tokens, "temperature": 0, "stream": True}
    start, ttft, n = time.perf_counter(), None, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    ttft = time.perf_counter() - start
                if chunk.get("usage"):
                    n = chunk["usage"]["completion_tokens"]
    return n, ttft or 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,4,16,64")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    proc, url = start_server(f'log_level = "warning"\nmax_queue = {max(levels)}\nollama_port = 0\n'
                             f'[[models]]\nid = "bench"\nsource = "demo:{args.size}"\n')
    try:
        one_stream(url, args.tokens, -1)  # warm
        base = None
        print(f"demo:{args.size}, {args.tokens} tokens per stream, serial engine path")
        print(f"{'streams':>8} {'agg tok/s':>10} {'ratio':>7} {'worst TTFT s':>13}")
        for n in levels:
            start = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                results = list(pool.map(lambda i: one_stream(url, args.tokens, i), range(n)))
            wall = time.perf_counter() - start
            agg = sum(r[0] for r in results) / wall
            base = base or agg
            print(f"{n:>8} {agg:>10.1f} {agg / base:>7.2f} {max(r[1] for r in results):>13.2f}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
