"""Steering cost: tokens/s of the same engine, prompt and greedy decode with no SAE, with
one demo SAE layer steering (8 features), and steering plus a readout (top 8 features at
every completion position, post-steering), in-process through the serial path's decoder
(detokenisation and stops included). Runs are interleaved so drift hits all modes alike;
prints the medians and the ratios to no SAE (the goal for steering: ≥ 0.97).

    .venv/bin/python bench/steering.py [--size tiny|100m|1b] [--tokens N] [--runs R]
                                       [--sae-width W] [--device cpu|cuda:0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine actors run (greenroom/actors/runtime.py)

import torch  # noqa: E402

from greenroom.engines.base import SamplingParams  # noqa: E402
from greenroom.engines.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.demo_sae import ensure_demo_sae  # noqa: E402
from greenroom.engines.generation import Decoder  # noqa: E402
from greenroom.engines.sae import load_sae  # noqa: E402
from greenroom.engines.steering import SteeringState  # noqa: E402
from greenroom.engines.transformers_engine import TransformersEngine  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the ships that pass in the night."


def run(engine, tokens: int, readout: bool) -> tuple[float, int]:
    ids = engine.tokenize(PROMPT)
    params = SamplingParams(max_tokens=tokens, temperature=0)
    reader = engine.steering.readout(len(ids), top_k=8, positions="completion") if readout else None
    decoder = Decoder(engine, params)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    n = 0
    steps = engine.generate_ids(ids, params, readout=reader)
    for token, logprob in steps:
        delta = decoder.feed(token, logprob)
        n = delta.completion_tokens
        if delta.finish_reason:
            break
    steps.close()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sae-width", type=int, default=None, help="default: 4 × d_model")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cache = default_cache_dir()
    engine = TransformersEngine("bench", ensure_demo_model(cache, args.size), device=args.device)
    sae = load_sae(ensure_demo_sae(cache, args.size, width=args.sae_width))
    info = engine.steering.attach("bench", sae)
    strengths = {"bench": {i * 37 % info.width: 20.0 for i in range(8)}}

    def push(enabled: bool) -> None:
        engine.steering.apply(SteeringState(engine.steering.state.version + 1, enabled, strengths))

    modes = {"none": [], "steering": [], "steering+readout": []}

    def once(mode: str, tokens: int):
        # "none" detaches the SAE, so it pays for no hook at all
        if mode == "none":
            engine.steering.detach("bench")
        else:
            push(True)
        try:
            return run(engine, tokens, readout=mode == "steering+readout")
        finally:
            if mode == "none":
                engine.steering.attach("bench", sae)
            else:
                push(False)

    for mode in modes:  # warm every path at the full length (CUDA's first runs are slow)
        once(mode, args.tokens)
    for _ in range(args.runs):
        for mode, results in modes.items():
            results.append(once(mode, args.tokens))
    tps = {mode: statistics.median(r[0] for r in results) for mode, results in modes.items()}
    print(
        f"model demo:{args.size} ({engine.info.parameters / 1e6:.1f}M params, {engine.info.dtype}, "
        f"{engine.info.device}); SAE {info.hook_point} width {info.width} ({info.architecture}), "
        f"8 features steered; {modes['none'][0][1]} tokens greedy, median of {args.runs} interleaved runs"
    )
    for mode, value in tps.items():
        print(f"  {mode:<17} {value:9.1f} tok/s   ratio to none {value / tps['none']:.3f}")


if __name__ == "__main__":
    main()
