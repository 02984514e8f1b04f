"""In-process decode throughput of N sequences, four ways: one after another (the serial
engine path), transformers' continuous batching manager (`generate_batch`), a static batch
(`generate` on N left-padded prompts, every sequence the same length: the ceiling), and
greenroom's decode-step batch (`engines/transformers/batching.py`, every sequence joining at once) —
the last two of greenroom's also on the fixed-shape path (`engines/transformers/fixed_shape.py`, compiled
on CUDA, eager here on the CPU). The measurement that chose greenroom's own batch over
transformers' manager.

    .venv/bin/python bench/batching.py [--size tiny|100m|1b] [--n 16] [--tokens 64] [--device cpu|cuda:0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from greenroom.engines.base import SamplingParams  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.generation import generate  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402

GREEDY = SamplingParams(temperature=0)


def timed(fn, repeat: int) -> float:
    """The best of `repeat` runs after a warm one at the same shapes (a shared machine is noisy)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = ensure_demo_model(default_cache_dir(), args.size)
    engine = TransformersEngine("bench", path, device=args.device, fixed_shape="off")
    fixed = TransformersEngine(
        "bench", path, device=args.device, fixed_shape="on", fixed_shape_slots=args.n, fixed_shape_length=512
    )
    prompts = [engine.tokenize(f"Story number {i} about the sea") for i in range(args.n)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0)
    total = args.n * args.tokens
    model, device = engine.model, engine.device

    def serial(engine=engine):
        for ids in prompts:
            for _ in generate(engine, ids, params):
                pass

    gen_cfg = GenerationConfig(max_new_tokens=args.tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    # sized for the run: on the CPU the default KV cache takes gigabytes (DESIGN.md)
    cb_cfg = ContinuousBatchingConfig(num_blocks=args.n * (args.tokens // 32 + 3), page_size=32, max_batch_tokens=512)

    def manager():
        model.generate_batch(prompts, generation_config=gen_cfg, continuous_batching_config=cb_cfg, warmup=False)

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def static():
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.tokens,
                min_new_tokens=args.tokens,
                do_sample=False,
                pad_token_id=0,
            )

    def greenroom(engine=engine):
        batch = engine.new_batch(GREEDY)
        batch.join([(i, p, params) for i, p in enumerate(prompts)])
        while len(batch):
            batch.step()

    print(f"demo:{args.size} on {args.device}, {args.n} sequences × {args.tokens} tokens (greedy)")
    base = None
    for name, fn in [
        ("serial (one at a time)", serial),
        ("transformers generate_batch", manager),
        ("static batch (generate)", static),
        ("greenroom DecodeBatch", greenroom),
        ("serial, fixed shape", lambda: serial(fixed)),
        ("DecodeBatch, fixed shape", lambda: greenroom(fixed)),
    ]:
        rate = total / timed(fn, args.repeat)
        base = base or rate
        print(f"  {name:<28} {rate:>9.1f} tok/s  {rate / base:>5.2f}× serial")


if __name__ == "__main__":
    main()
