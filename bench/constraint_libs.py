"""Constraint libraries compared on the demo model: llguidance (greenroom's choice, through
greenroom.engines.text.constraints) and xgrammar (measured only, never a dependency).

For each library: import time (fresh process), tokenizer set-up, grammar compile time
(median of fresh compiles, caches off) for three grammars, per-token cost of a real
constrained generation (mask = compute the allowed set + apply it to the logits row;
consume = advance the state; median over every step of several seeded runs, beside the
model's own forward time), and keyword coverage: for each keyword of greenroom's subset,
generate with the random demo model on several seeds (temperature 1) and validate every
completed document with jsonschema.

    .venv/bin/python bench/constraint_libs.py [--size tiny|100m] [--seeds N] [--libs llguidance,xgrammar]

xgrammar is optional: install it for a measurement without its declared `triton`
dependency, and remove it afterwards (see docs/structured-output.md):

    .venv/bin/uv pip install --python .venv/bin/python --override overrides.txt --no-deps \
        'xgrammar>=0.2,<0.3' apache-tvm-ffi
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jsonschema  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402

SEPARATORS = (", ", ": ")  # what greenroom's llguidance grammars write; xgrammar is set the same

SIMPLE = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
RICH = {
    "type": "object",
    "properties": {
        "label": {"enum": ["humor", "not_humor", "unsure"]},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 18, "maximum": 99},
                "name": {"type": "string", "minLength": 1, "maxLength": 8},
            },
            "required": ["age", "name"],
            "additionalProperties": False,
        },
    },
    "required": ["label", "code", "tags", "owner"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "maxLength": 6}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -5, "maximum": 5},
                    "b": {"type": "integer", "minimum": -5, "maximum": 5},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]

# One schema per keyword of the subset (docs/structured-output.md), bounded so that a random
# model can finish it within the token budget.
COVERAGE: dict[str, dict] = {
    "type (all seven)": {
        "type": "object",
        "properties": {
            "s": {"type": "string", "maxLength": 4},
            "n": {"type": "number", "minimum": 0, "maximum": 9},
            "i": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "a": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}},
            "o": {"type": "object", "properties": {}, "additionalProperties": False},
        },
        "required": ["s", "n", "i", "b", "z", "a", "o"],
        "additionalProperties": False,
    },
    "type (list)": {
        "type": "array",
        "maxItems": 4,
        "items": {"type": ["integer", "null"], "minimum": 0, "maximum": 99},
    },
    "properties+required": {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "boolean"}},
        "required": ["b"],
        "additionalProperties": False,
    },
    "additionalProperties: false": {
        "type": "object",
        "properties": {"x": {"type": "boolean"}},
        "additionalProperties": False,
    },
    "additionalProperties: schema": {
        "type": "object",
        "properties": {"k": {"type": "boolean"}},
        "required": ["k"],
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3},
    },
    "items+minItems+maxItems": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {"enum": ["red", "green", 3, None, {"k": [1, 2]}]},
    "const": {
        "type": "object",
        "properties": {"v": {"const": "fixed"}, "w": {"const": 7}},
        "required": ["v", "w"],
        "additionalProperties": False,
    },
    "minimum+maximum (integer)": {
        "type": "array",
        "maxItems": 6,
        "items": {"type": "integer", "minimum": -3, "maximum": 7},
    },
    "minimum+maximum (number)": {
        "type": "array",
        "maxItems": 6,
        "items": {"type": "number", "minimum": -1.5, "maximum": 2.25},
    },
    "minLength+maxLength": {
        "type": "array",
        "maxItems": 3,
        "items": {"type": "string", "minLength": 3, "maxLength": 6},
    },
    "pattern": {"type": "array", "maxItems": 3, "items": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}},
    "pattern+maxLength": {
        "type": "array",
        "maxItems": 3,
        "items": {"type": "string", "pattern": "^[a-z ]+$", "maxLength": 5},
    },
    "pattern+minLength": {
        "type": "array",
        "maxItems": 3,
        "items": {"type": "string", "pattern": "^[a-c]{1,8}$", "minLength": 6},
    },
    "anyOf": {
        "type": "array",
        "maxItems": 4,
        "items": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "string", "maxLength": 3}]},
    },
    "$ref into $defs": {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/P"}, "q": {"$ref": "#/$defs/P"}},
        "required": ["p", "q"],
        "additionalProperties": False,
        "$defs": {"P": {"type": "integer", "minimum": 1, "maximum": 3}},
    },
}


# -- the two libraries behind one small interface ---------------------------------------------


class Llguidance:
    name = "llguidance"

    def __init__(self, engine):
        from greenroom.engines.text.constraints import Constraints

        start = time.perf_counter()
        self.c = Constraints(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, cache_size=0)
        self.setup_s = time.perf_counter() - start

    def compile(self, kind: str, payload):
        if kind == "json":
            return self.c.json_schema(payload)
        return self.c.tool_calls(payload, parallel=False)

    def matcher(self, compiled):
        m = self.c.matcher(compiled)
        return m.mask, m.consume, m.done


class Xgrammar:
    name = "xgrammar"

    def __init__(self, engine):
        import xgrammar as xgr

        self.xgr = xgr
        start = time.perf_counter()
        eos = sorted(engine.eos_token_ids)
        self.info = xgr.TokenizerInfo.from_huggingface(
            engine.tokenizer, vocab_size=engine.vocab_size, stop_token_ids=eos
        )
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False, max_threads=1)
        self.setup_s = time.perf_counter() - start
        self.vocab = engine.vocab_size

    def _json(self, schema):
        return self.xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)

    def compile(self, kind: str, payload):
        if kind == "json":
            return self.compiler.compile_json_schema(json.dumps(payload), any_whitespace=False, separators=SEPARATORS)
        G = self.xgr.Grammar
        calls = [self._json(_call_schema(t["function"])) for t in payload]
        grammar = G.concat(
            G.from_ebnf('root ::= "<tool_call>\\n"'), G.union(*calls), G.from_ebnf('root ::= "\\n</tool_call>"')
        )
        return self.compiler.compile_grammar(grammar)

    def matcher(self, compiled):
        xgr = self.xgr
        m = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, self.vocab)

        def mask(logits):
            m.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits.unsqueeze(0), bitmask)

        def consume(token):
            if not m.accept_token(token):
                raise RuntimeError(f"xgrammar refused token {token}")

        return mask, consume, m.is_terminated


def _call_schema(fn: dict) -> dict:
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# -- measurements -----------------------------------------------------------------------------


class SyntheticModel:
    """A byte-level BPE tokenizer of `vocab` tokens trained on generated pseudo-words (no
    download, deterministic), for the mask cost at real vocabulary sizes; logits are random."""

    def __init__(self, vocab: int, seed: int = 0):
        import random

        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        rng = random.Random(seed)
        syllables = [a + b for a in "bcdfghjklmnpqrstvwxyz" for b in "aeiouy"] + list("aeiou")
        lexicon = [
            "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(max(60_000, vocab * 3))
        ]
        extra = [".", ",", ":", '"', "{", "}", "[", "]", "(", ")", "0", "1", "42", "3.14", "\n", "  "]
        lines = (
            " ".join(rng.choice(lexicon) if rng.random() < 0.85 else rng.choice(extra) for _ in range(20))
            for _ in range(max(20_000, vocab))
        )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            lines,
            trainer=trainers.BpeTrainer(
                vocab_size=vocab,
                special_tokens=["<s>", "</s>"],
                show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
        self.vocab_size = tok.get_vocab_size()
        self.eos_token_ids = frozenset({self.tokenizer.eos_token_id})


def synthetic_mask_us(
    model: SyntheticModel, lib, compiled, seeds: int, max_tokens: int = 200
) -> tuple[float, float, int]:
    """Median and p90 µs of mask (compute + apply) while walking the grammar with random
    logits (a uniform choice among the allowed tokens)."""
    times = []
    for seed in range(seeds):
        mask, consume, done = lib.matcher(compiled)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(max_tokens):
            logits = torch.randn(model.vocab_size, generator=gen)
            start = time.perf_counter()
            mask(logits)
            times.append(time.perf_counter() - start)
            token = int(torch.argmax(logits))
            consume(token)
            if token in model.eos_token_ids or done():
                break
    return statistics.median(times) * 1e6, statistics.quantiles(times, n=10)[-1] * 1e6, len(times)


def import_seconds(module: str) -> float:
    code = f"import time, torch, transformers; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(out.stdout.strip()) if out.returncode == 0 else float("nan")


def compile_ms(lib, kind: str, payload, runs: int = 15) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        lib.compile(kind, payload)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def generate(engine, lib, compiled, seed: int, max_tokens: int, timings: dict | None = None):
    """One constrained sampled generation (temperature 1). Returns (text, finished)."""
    mask, consume, done = lib.matcher(compiled)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([engine.tokenize("Answer in JSON.")])
    cache = DynamicCache()
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            t0 = time.perf_counter()
            logits = (
                engine.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{engine.cache_arg: cache})
                .logits[0, -1]
                .float()
            )
            t1 = time.perf_counter()
            mask(logits)
            t2 = time.perf_counter()
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            t3 = time.perf_counter()
            consume(token)
            t4 = time.perf_counter()
            if timings is not None:
                timings["forward"].append(t1 - t0)
                timings["mask"].append(t2 - t1)
                timings["consume"].append(t4 - t3)
            if token in engine.eos_token_ids:
                return engine.decode(out), True
            out.append(token)
            if done():
                return engine.decode(out), True
            ids = torch.tensor([[token]])
    return engine.decode(out), False


def coverage(engine, lib, schema: dict, seeds: int, max_tokens: int) -> tuple[int, int, str]:
    """(valid, finished, first failure) over `seeds` generations."""
    try:
        compiled = lib.compile("json", schema)
    except Exception as e:  # noqa: BLE001 - a library refusing a keyword is a result
        return 0, 0, f"compile: {str(e)[:80]}"
    valid = finished = 0
    failure = ""
    for seed in range(seeds):
        try:
            text, ok = generate(engine, lib, compiled, seed, max_tokens)
        except Exception as e:  # noqa: BLE001
            failure = failure or f"seed {seed}: {str(e)[:80]}"
            continue
        if not ok:
            continue
        finished += 1
        try:
            jsonschema.validate(json.loads(text), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as e:
            failure = failure or f"seed {seed}: {text[:60]!r} ({str(e).splitlines()[0][:60]})"
    return valid, finished, failure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", choices=["tiny", "100m"])
    ap.add_argument("--seeds", type=int, default=8, help="seeds per coverage keyword (0 skips coverage)")
    ap.add_argument("--perf-seeds", type=int, default=6, help="seeded runs per grammar for the per-token cost")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--libs", default="llguidance,xgrammar")
    ap.add_argument("--vocab", default="32000,128000", help="synthetic tokenizer sizes for the mask cost ('' skips)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    engine = TransformersEngine("greenroom-demo", ensure_demo_model(default_cache_dir(), args.size), threads=1)
    libs = []
    for name in args.libs.split(","):
        try:
            libs.append({"llguidance": Llguidance, "xgrammar": Xgrammar}[name](engine))
        except ImportError:
            print(f"# {name} is not installed: skipped")
    print(
        f"# demo {args.size}: vocab {engine.vocab_size}, {torch.get_num_threads()} torch thread(s), "
        f"{os.cpu_count()} cores\n"
    )

    grammars = {
        "simple object": ("json", SIMPLE),
        "enum+pattern+minItems+$ref": ("json", RICH),
        "tool call (2 tools)": ("tools", TOOLS),
    }
    print("## set-up and compile (ms; compile = median of 15 fresh compiles, caches off)\n")
    header = "| library | version | import (s) | tokenizer set-up | " + " | ".join(grammars) + " |"
    print(header)
    print("|" + " --- |" * (4 + len(grammars)))
    from importlib.metadata import version

    for lib in libs:
        cells = [f"{compile_ms(lib, kind, payload):.2f}" for kind, payload in grammars.values()]
        print(
            f"| {lib.name} | {version(lib.name)} | {import_seconds(lib.name):.2f} | {lib.setup_s * 1e3:.1f} | "
            + " | ".join(cells)
            + " |"
        )

    print(f"\n## per-token cost (µs, median over every step of {args.perf_seeds} seeded generations)\n")
    print("| library | grammar | steps | forward | mask (compute + apply) | consume | mask p90 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lib in libs:
        for gname, (kind, payload) in grammars.items():
            compiled = lib.compile(kind, payload)
            timings = {"forward": [], "mask": [], "consume": []}
            for seed in range(args.perf_seeds):
                generate(engine, lib, compiled, seed, args.max_tokens, timings)
            med = {k: statistics.median(v) * 1e6 for k, v in timings.items()}
            p90 = statistics.quantiles(timings["mask"], n=10)[-1] * 1e6
            print(
                f"| {lib.name} | {gname} | {len(timings['mask'])} | {med['forward']:.0f} | {med['mask']:.0f} | "
                f"{med['consume']:.0f} | {p90:.0f} |"
            )

    sizes = [int(v) for v in args.vocab.split(",") if v]
    if sizes:
        print("\n## mask cost at real vocabulary sizes (synthetic byte-level BPE, random logits; µs)\n")
        print("| library | vocab | grammar | tokenizer set-up (ms) | compile (ms) | steps | mask median | mask p90 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    classes = {"llguidance": Llguidance, "xgrammar": Xgrammar}
    for size in sizes:
        model = SyntheticModel(size)
        for lib in libs:
            big = classes[lib.name](model)
            for gname, (kind, payload) in grammars.items():
                compile_time = compile_ms(big, kind, payload, runs=5)
                med, p90, steps = synthetic_mask_us(model, big, big.compile(kind, payload), args.perf_seeds)
                print(
                    f"| {lib.name} | {model.vocab_size:,} | {gname} | {big.setup_s * 1e3:.0f} | {compile_time:.1f} | "
                    f"{steps} | {med:.0f} | {p90:.0f} |"
                )

    if not args.seeds:
        return
    print(
        f"\n## keyword coverage: valid / finished of {args.seeds} seeds (max {args.max_tokens} tokens), "
        "validated with jsonschema\n"
    )
    print("| keyword | " + " | ".join(lib.name for lib in libs) + " |")
    print("| --- |" + " --- |" * len(libs))
    failures = []
    for keyword, schema in COVERAGE.items():
        cells = []
        for lib in libs:
            valid, finished, failure = coverage(engine, lib, schema, args.seeds, args.max_tokens)
            mark = "" if valid == finished and finished else " ✗"
            cells.append(f"{valid}/{finished}{mark}")
            if failure:
                failures.append(f"- {lib.name}, {keyword}: {failure}")
        print(f"| {keyword} | " + " | ".join(cells) + " |")
    if failures:
        print("\nfirst failure per cell:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
