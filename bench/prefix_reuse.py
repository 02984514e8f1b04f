"""Automatic prefix reuse through a live server: the time to first token of a request that
shares a ~1,000-token prefix with an earlier one, on a server with reuse (the default) and one
without (prefix_cache_tokens = 0), measured alternately; then the same mixed requests (greedy
and seeded, chat and completions) to both, counting the answers that differ.

    .venv/bin/python bench/prefix_reuse.py [--size 100m] [--prefix 1000] [--runs 7] [--mixed 50]
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
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench.server import start_server  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402

STORY = "The lighthouse keeper wrote in his log every night, about the sea, the ships and the gulls. "


def shared_prefix(size: str, tokens: int) -> str:
    """A text of at least `tokens` tokens of the demo vocabulary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_demo_model(default_cache_dir(), size))
    text = STORY
    while len(tokenizer.encode(text)) < tokens:
        text += STORY
    return text


def ttft(http: httpx.Client, url: str, prompt: str) -> float:
    body = {"model": "bench", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with http.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                return time.perf_counter() - start
    raise SystemExit(f"no text came back: {r.status_code}")


def answer(http: httpx.Client, url: str, i: int, prefix: str) -> str:
    """Mixed request i: a prefix shared with others (or none), greedy or seeded, chat or completion."""
    text = prefix[: len(prefix) * (1 + i % 4) // 4 - 11 * (i % 5)] + f" Question {i}: what came next?"
    if i % 7 == 0:
        text = f"Nothing shared {i}."
    sampling = {"temperature": 0} if i % 3 else {"temperature": 0.9, "top_p": 0.9, "seed": i}
    if i % 2:
        body = {"model": "bench", "prompt": text, "max_tokens": 16, **sampling}
        return http.post(url + "/v1/completions", json=body).json()["choices"][0]["text"]
    body = {"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": 16, **sampling}
    return http.post(url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="100m")
    ap.add_argument("--prefix", type=int, default=1000, help="tokens the requests share")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--mixed", type=int, default=50)
    args = ap.parse_args()
    prefix = shared_prefix(args.size, args.prefix)
    config = f'log_level = "warning"\nollama_port = 0\n[[models]]\nid = "bench"\nsource = "demo:{args.size}"\n'
    servers = {
        name: start_server(extra + config) for name, extra in (("reuse", ""), ("none", "prefix_cache_tokens = 0\n"))
    }
    try:
        with httpx.Client(timeout=600) as http:
            urls = {name: url for name, (_, url) in servers.items()}
            for url in urls.values():
                ttft(http, url, prefix + " Warm up.")  # stores the prefix where reuse is on
            seen = {name: [] for name in urls}
            for k in range(args.runs):  # alternately, so drift hits both alike
                for name, url in urls.items():
                    seen[name].append(ttft(http, url, prefix + f" Question {k}: what came next?"))
            differ = sum(
                answer(http, urls["reuse"], i, prefix) != answer(http, urls["none"], i, prefix)
                for i in range(args.mixed)
            )
            stats = http.get(urls["reuse"] + "/api/actors").json()["actors"]
            cache = next(a for a in stats if a["name"] not in ("supervisor", "steering"))["counters"]
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    with_reuse, without = statistics.median(seen["reuse"]), statistics.median(seen["none"])
    print(f"demo:{args.size}, a {args.prefix}-token shared prefix, median of {args.runs} streamed completions")
    print(f"TTFT without reuse: {without * 1000:8.1f} ms")
    print(f"TTFT with reuse   : {with_reuse * 1000:8.1f} ms")
    print(f"ratio (without / with): {without / with_reuse:.1f}x")
    print(f"mixed requests whose answers differ: {differ} of {args.mixed}")
    print(f"prefix store: {cache['prefix_cache']['bench']}")


if __name__ == "__main__":
    main()
