"""Structured-output cost: tokens/s of the same engine, prompt and seed with a
json_schema constraint versus unconstrained, in-process (the mask is applied inside the
engine's decode loop, so this is what a served request pays per token). Prints the ratio.
`--schema numbers` measures a document of numbers (each bounded to what clients hold,
engines/text/constraints.py) instead of one long string.

    .venv/bin/python bench/constrained.py [--size tiny|100m] [--tokens N] [--runs R] [--schema story|numbers]
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

from greenroom.engines.base import JsonSchemaConstraint, SamplingParams  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.generation import generate  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402

SCHEMAS = {
    # one long string field: the random demo model keeps writing it, so every run reaches max_tokens
    "story": {
        "type": "object",
        "properties": {"label": {"enum": ["a", "b"]}, "story": {"type": "string"}},
        "required": ["label", "story"],
        "additionalProperties": False,
    },
    # numbers only, in an array without end: every token is inside a number or between two
    "numbers": {
        "type": "object",
        "properties": {"values": {"type": "array", "items": {"type": "number"}, "minItems": 10000}},
        "required": ["values"],
        "additionalProperties": False,
    },
}
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper, as JSON."}]


def run(engine, tokens: int, grammar) -> tuple[float, int]:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=0)
    start = time.perf_counter()
    n = 0
    for delta in generate(engine, engine.render_chat(PROMPT), params, grammar):
        n = delta.completion_tokens
    return n / (time.perf_counter() - start), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--schema", choices=sorted(SCHEMAS), default="story")
    args = ap.parse_args()
    engine = TransformersEngine("bench", ensure_demo_model(default_cache_dir(), args.size))
    t = time.perf_counter()
    grammar = engine.compile_constraint(JsonSchemaConstraint(SCHEMAS[args.schema]))
    compile_ms = (time.perf_counter() - t) * 1000
    run(engine, 16, None), run(engine, 16, grammar)  # warm both
    free, constrained = [], []
    for _ in range(args.runs):  # interleaved, so drift hits both alike
        free.append(run(engine, args.tokens, None))
        constrained.append(run(engine, args.tokens, grammar))
    tps_free = statistics.median(r[0] for r in free)
    tps_con = statistics.median(r[0] for r in constrained)
    per_token_ms = (1 / tps_con - 1 / tps_free) * 1000
    print(
        f"model demo:{args.size} ({engine.info.parameters / 1e6:.1f}M params), {free[0][1]} vs "
        f"{constrained[0][1]} tokens, median of {args.runs} runs; schema {args.schema!r} compiled in "
        f"{compile_ms:.1f} ms"
    )
    print(f"unconstrained : {tps_free:8.1f} tok/s")
    print(f"json_schema   : {tps_con:8.1f} tok/s   (+{per_token_ms:.3f} ms/token)")
    print(f"ratio constrained/unconstrained: {tps_con / tps_free:.3f}")


if __name__ == "__main__":
    main()
