"""Aggregate throughput under concurrency: N streams at once against `greenroom serve`
(N = 1, 4, 16, 64) from bench/lean_client.py in a process of its own, tokens/s summed over
all of them, printed as a ratio to one stream, for the serial engine path and for continuous
batching (`continuous_batching = true`).
Also the time to first token seen by the slowest stream. Every stream asks for the
server's fixed sampling parameters (no temperature, top_p, seed or penalty), so under
continuous batching all of them are batchable; the serial server runs the same bodies.

    .venv/bin/python bench/concurrency.py [--size tiny|100m] [--tokens N] [--levels 1,4,16,64]
                                          [--modes serial,batching]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lean_client import streams  # noqa: E402
from bench.server import start_server  # noqa: E402


def run(mode: str, size: str, tokens: int, levels: list[int]) -> list[float]:
    proc, url = start_server(
        f'log_level = "warning"\nmax_queue = {max(levels)}\nollama_port = 0\n'
        f"continuous_batching = {'true' if mode == 'batching' else 'false'}\n"
        f'[[models]]\nid = "bench"\nsource = "demo:{size}"\n'
    )
    rates = []
    try:
        backend = httpx.get(url + "/api/health/inference", timeout=10).json()["backend"]
        streams(url, 1, tokens)  # warm
        print(f"demo:{size}, {tokens} tokens per stream, backend {backend}")
        print(f"{'streams':>8} {'agg tok/s':>10} {'ratio':>7} {'worst TTFT s':>13} {'client CPU s':>13}")
        for n in levels:
            figures = streams(url, n, tokens)
            rates.append(figures["tok_s"])
            print(
                f"{n:>8} {rates[-1]:>10.1f} {rates[-1] / rates[0]:>7.2f} {figures['ttft_worst_s']:>13.2f} "
                f"{figures['client_cpu_s']:>13.2f}"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--modes", default="serial,batching")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rates = {mode: run(mode, args.size, args.tokens, levels) for mode in args.modes.split(",")}
    if len(rates) == 2:
        (a, ra), (b, rb) = rates.items()
        print(f"{b} / {a}: " + ", ".join(f"{n} streams {y / x:.2f}×" for n, x, y in zip(levels, ra, rb)))


if __name__ == "__main__":
    main()
