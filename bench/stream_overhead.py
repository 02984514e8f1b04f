"""Stream overhead: one stream through `greenroom serve` (HTTP → supervisor → engine
actor → SSE) versus the same engine called in-process, same model, prompt and
greedy decoding. Prints tokens/s and time-to-first-token for both, and the ratios.

    .venv/bin/python bench/stream_overhead.py [--size tiny|100m] [--tokens N] [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine actors run (greenroom/actors/runtime.py)

from bench.server import start_server  # noqa: E402
from greenroom.config import detect_engine_actors  # noqa: E402
from greenroom.engines.base import SamplingParams  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.generation import generate  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def in_process(engine, tokens: int) -> tuple[float, float, int]:
    params = SamplingParams(max_tokens=tokens, temperature=0)
    start = time.perf_counter()
    ttft = None
    n = 0
    for delta in generate(engine, engine.render_chat(PROMPT), params):
        if ttft is None and delta.text:
            ttft = time.perf_counter() - start
        n = delta.completion_tokens
    return n / (time.perf_counter() - start), ttft, n


def over_http(http: httpx.Client, url: str, model: str, tokens: int) -> tuple[float, float, int]:
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    ttft = None
    n = 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
    return n / (time.perf_counter() - start), ttft, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    # the same device the server's first engine actor gets: gpu0 → cuda:0, else cpu
    device = "cuda:0" if detect_engine_actors()[0] == "gpu0" else "cpu"
    engine = TransformersEngine("bench", ensure_demo_model(default_cache_dir(), args.size), device=device)
    proc, url = start_server(
        f'log_level = "warning"\nollama_port = 0\n[[models]]\nid = "bench"\nsource = "demo:{args.size}"\n'
    )
    try:
        with httpx.Client(timeout=600) as http:  # one connection, as a real client keeps
            # warm both paths at full length: on CUDA a thread's first generations run
            # several times slower (measured on an H200: 16 vs 86 tok/s, 1B bf16)
            in_process(engine, args.tokens), over_http(http, url, "bench", args.tokens)
            local, remote = [], []
            for _ in range(args.runs):  # interleaved, so drift hits both alike
                local.append(in_process(engine, args.tokens))
                remote.append(over_http(http, url, "bench", args.tokens))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    assert {r[2] for r in local} == {r[2] for r in remote}, "both paths must generate the same tokens"
    tps_l, tps_r = med(local, 0), med(remote, 0)
    ttft_l, ttft_r = med(local, 1), med(remote, 1)
    print(
        f"model demo:{args.size} ({engine.info.parameters / 1e6:.1f}M params, {engine.info.dtype} on "
        f"{engine.info.device}), {local[0][2]} tokens, median of {args.runs} runs"
    )
    print(f"in-process : {tps_l:8.1f} tok/s   TTFT {ttft_l * 1000:7.1f} ms")
    print(f"HTTP stream: {tps_r:8.1f} tok/s   TTFT {ttft_r * 1000:7.1f} ms")
    print(f"ratio tokens/s HTTP/in-process: {tps_r / tps_l:.3f}   TTFT overhead: {(ttft_r - ttft_l) * 1000:+.1f} ms")


if __name__ == "__main__":
    main()
