"""Open WebUI's conversation through a live server: every message carries its built-in tools
(tests/data/open_webui_tools.json: ~13,700 tokens rendered by the demo tokenizer, ~7,000 by
SmolLM2's) after a system message, then the conversation so far, streamed on /v1/chat/completions
as Open WebUI sends it. Prints each message's time to first token and the ratio of each later
message's to the first's (issue 35's target: the second ≤ 0.2 × the first), on a server with
prefix reuse (the default) and, side by side, one without; conversations alternate between the
two servers, each opened by a system message of its own (so its first message finds nothing
stored), and the figures are medians over the repeats.

    .venv/bin/python bench/open_webui_prefix.py [--source demo:tiny] [--engine transformers]
        [--messages 3] [--runs 3] [--max-tokens 8] [--without "prefix_cache_tokens = 0"]

A GGUF source (demo-gguf:Q8_0, as configs/default.toml names the demo's) measures the llama.cpp
engine (served with n_ctx = 0: its trained window holds the tools); --without is the TOML the
server without reuse adds (transformers: prefix_cache_tokens = 0; llama.cpp: none by default —
give the key that turns its reuse off, or "" for the server with reuse alone).
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine actors run (greenroom/actors/runtime.py)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402

TOOLS = json.loads((ROOT / "tests" / "data" / "open_webui_tools.json").read_text())
QUESTIONS = ["Hello! What can you do?", "Which of your tools finds a web page?", "Thank you. And the time?"]
QUESTIONS += [f"And question {i}?" for i in range(4, 10)]
WITHOUT = {"transformers": "prefix_cache_tokens = 0", "llama.cpp": ""}


def message(http: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
    """One streamed message: seconds to its first token (text or a tool call), its text, its prompt's tokens."""
    body = {
        "model": "bench",
        "messages": messages,
        "tools": TOOLS,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, text, usage = time.perf_counter(), None, "", None
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if first is None and (delta.get("content") or delta.get("tool_calls") or choice["finish_reason"]):
                    first = time.perf_counter() - start
                text += delta.get("content") or ""
    return first, text, usage["prompt_tokens"]


def conversation(http: httpx.Client, url: str, k: int, n: int, max_tokens: int) -> tuple[list[float], list[str], int]:
    """Conversation `k` of `n` messages, each with the answers before it: each message's time to
    first token, its answers, and the first message's prompt tokens."""
    messages = [{"role": "system", "content": f"You are a helpful assistant. Conversation {k}."}]
    times, answers, tokens = [], [], 0
    for question in QUESTIONS[:n]:
        messages.append({"role": "user", "content": question})
        seconds, text, prompt = message(http, url, messages, max_tokens)
        tokens = tokens or prompt
        times.append(seconds)
        answers.append(text)
        messages.append({"role": "assistant", "content": text})
    return times, answers, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="demo:tiny", help="demo:<size>, demo-gguf:<QUANT>, a checkpoint or a .gguf")
    ap.add_argument("--engine", default="transformers", choices=sorted(WITHOUT))
    ap.add_argument("--messages", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--without", default=None, help="TOML the server without reuse adds ('': no such server)")
    args = ap.parse_args()
    without = WITHOUT[args.engine] if args.without is None else args.without
    model = f'[[models]]\nid = "bench"\nsource = "{args.source}"\nengine = "{args.engine}"\n'
    model += "n_ctx = 0\n" if args.engine == "llama.cpp" else ""
    config = 'log_level = "warning"\nollama_port = 0\n'
    wanted = {"reuse": config, **({"none": config + without + "\n"} if without else {})}
    servers = {name: start_server(text + model) for name, text in wanted.items()}
    seen = {name: [] for name in servers}
    answers, tokens = {name: [] for name in servers}, 0
    try:
        with httpx.Client(timeout=1800) as http:
            for run in range(args.runs):  # alternately, so drift hits both alike
                for name, (_, url) in servers.items():
                    times, said, tokens = conversation(http, url, run, args.messages, args.max_tokens)
                    seen[name].append(times)
                    answers[name].append(said)
                    print(f"run {run + 1} {name}: " + "  ".join(f"{t * 1000:.0f} ms" for t in times), flush=True)
            actors = http.get(servers["reuse"][1] + "/api/actors").json()["actors"]
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    print(
        f"\n{args.source} on {args.engine}: Open WebUI's {args.messages}-message conversation, its first "
        f"message {tokens} prompt tokens; median of {args.runs} conversations per server, alternating"
    )
    print("server  " + "".join(f"{f'TTFT {i + 1} (ms)':>14}" for i in range(args.messages)) + "  later/first")
    for name, runs in seen.items():
        medians = [statistics.median(run[i] for run in runs) for i in range(args.messages)]
        ratios = " ".join(f"{m / medians[0]:.3f}" for m in medians[1:])
        print(f"{name:8}" + "".join(f"{m * 1000:14.0f}" for m in medians) + f"  {ratios}")
    if "none" in answers:
        same = sum(a == b for a, b in zip(answers["reuse"], answers["none"]))
        print(f"conversations with the same greedy text on both servers: {same} of {args.runs}")
    for actor in actors:
        store = (actor.get("counters") or {}).get("prefix_cache", {}).get("bench")
        if store:
            print(f"prefix store ({actor['name']}): {store}")


if __name__ == "__main__":
    main()
