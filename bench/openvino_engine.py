"""Decode speed of the demo model on the OpenVINO engine (CPU device, and the NPU pipeline
on the CPU as it runs without an NPU) against the transformers engine, in-process, through
each engine's `generate_ids` (the path the engine actor takes).

For each engine: load time, time to first token, and steady decode tokens/s (greedy, a
chat prompt, --tokens tokens after the first; median of --runs runs after one warm-up),
then every figure as a ratio to transformers. OpenVINO runs at the CPU's default
precision (bf16 where the CPU has AVX-512 BF16 or AMX) and at float32.

    .venv/bin/python bench/openvino_engine.py [--size tiny|100m] [--tokens 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from greenroom.engines.base import SamplingParams  # noqa: E402
from greenroom.engines.loader import load_engine  # noqa: E402

CHAT = [{"role": "user", "content": "Tell me a story about a lighthouse keeper and the sea."}]


def measure(spec: dict, tokens: int, runs: int) -> dict:
    started = time.perf_counter()
    engine = load_engine(spec)
    load_s = time.perf_counter() - started
    prompt = engine.render_chat(CHAT)
    params = SamplingParams(max_tokens=tokens + 1, temperature=0)
    first, rates = [], []
    for run in range(runs + 1):
        started = time.perf_counter()
        steps = engine.generate_ids(prompt, params)
        next(steps)
        ttft = time.perf_counter() - started
        started = time.perf_counter()
        # generate_ids does not end by itself (the caller counts max_tokens): take exactly that many
        n = sum(1 for _ in itertools.islice(steps, tokens))
        rate = n / (time.perf_counter() - started)
        steps.close()
        if run:  # the first run warms caches and compiled kernels
            first.append(ttft)
            rates.append(rate)
    engine.unload()
    return {"load_s": load_s, "ttft_ms": statistics.median(first) * 1e3, "tok_s": statistics.median(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    engines = {
        "transformers (cpu, float32)": {"engine": "transformers", "source": f"demo:{args.size}", "device": "cpu"},
        "openvino CPU (default precision)": {
            "engine": "openvino",
            "source": f"demo-openvino:{args.size}",
            "device": "cpu",
        },
        "openvino CPU (float32)": {
            "engine": "openvino",
            "source": f"demo-openvino:{args.size}",
            "device": "cpu",
            "dtype": "float32",
        },
        "openvino NPU pipeline on CPU": {
            "engine": "openvino",
            "source": f"demo-openvino:{args.size}",
            "device": "npu:0",
            "max_prompt_len": 256,
            "min_response_len": args.tokens + 64,
        },
    }
    results = {}
    for name, spec in engines.items():
        results[name] = measure({"id": "bench", **spec}, args.tokens, args.runs)
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    base = results["transformers (cpu, float32)"]
    print(f"demo model {args.size}, {args.tokens} greedy tokens, median of {args.runs} runs, {os.cpu_count()} CPUs")
    print(f"{'engine':34} {'load s':>7} {'TTFT ms':>8} {'tok/s':>8} {'× transformers':>15}")
    for name, r in results.items():
        print(f"{name:34} {r['load_s']:7.2f} {r['ttft_ms']:8.1f} {r['tok_s']:8.0f} {r['tok_s'] / base['tok_s']:15.2f}")


if __name__ == "__main__":
    main()
