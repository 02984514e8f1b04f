"""A streaming client that costs the server's machine as little as possible, in a process of its
own: N streamed completions over raw sockets (asyncio), no JSON parsing of the chunks. It reads
each stream to its end, takes the token count from the last chunk (`usage.completion_tokens` on
/v1, `eval_count` on Ollama's /api) and the time to first token from the first chunk that
carries text. Prints one JSON line: aggregate tokens/s, worst and median TTFT, the frames read
(each one chunk the server wrote), and the CPU seconds this client used (so a bench can show
the client was not the bottleneck).

    python bench/lean_client.py URL --streams 32 --tokens 128 [--surface openai|completion|ollama]
        [--stagger-ms 0] [--model bench] [--prompt TEXT] [--keep-alive 1]

`--keep-alive R`: each stream sends R requests, one after another, on one keep-alive connection
(as an SDK's connection pool does); 1 (the default): one request on a fresh connection, which
says `Connection: close`. The figures then sum (tokens, frames) or pool (TTFT) all the requests.

`completion`: /v1/completions, greedy, every stream the same `--prompt` (how a peer server such
as llama-server is compared on the same file: bench/gguf_vs_peer.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

FIRST_TEXT = {  # the first chunk whose text is not empty
    "openai": re.compile(rb'"content":"[^"]'),
    "completion": re.compile(rb'"text":"[^"]'),
    "ollama": re.compile(rb'"(?:response|content)":"[^"]'),
}
USAGE = re.compile(rb'"completion_tokens":(\d+)')
COUNT = {"openai": USAGE, "completion": USAGE, "ollama": re.compile(rb'"eval_count":(\d+)')}
FRAME_END = {"openai": b"\n\n", "completion": b"\n\n", "ollama": b"}\n"}  # chunked encoding adds CRLFs only


def request(
    surface: str, host: str, model: str, tokens: int, i: int, prompt: str | None = None, close: bool = True
) -> bytes:
    messages = [{"role": "user", "content": f"Story number {i}"}]
    if surface == "completion":
        path = "/v1/completions"
        body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
    elif surface == "openai":
        path = "/v1/chat/completions"
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    else:
        path = "/api/chat"
        # the server's fixed sampling parameters and no seed (the spec's default is 0): batchable
        options = {"num_predict": tokens, "temperature": 1, "top_p": 1, "top_k": 0, "repeat_penalty": 1, "seed": -1}
        body = {"model": model, "messages": messages, "options": options}
    data = json.dumps(body).encode()
    connection = "Connection: close\r\n" if close else ""  # else HTTP/1.1's default: keep-alive
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{connection}\r\n"
    )
    return head.encode() + data


CHUNKED_END = b"\r\n0\r\n\r\n"  # a chunked body's last chunk: a kept-alive response's end


async def one(args, addr: tuple[str, int], i: int, delay: float):
    """Stream `i`: its requests (one, or --keep-alive of them on one connection), each one's
    (tokens, TTFT, frames)."""
    surface, keep = args.surface, args.keep_alive > 1
    await asyncio.sleep(delay)
    reader, writer = await asyncio.open_connection(*addr)
    answers = []
    for _ in range(args.keep_alive):
        start = time.perf_counter()
        writer.write(request(surface, addr[0], args.model, args.tokens, i, args.prompt, close=not keep))
        ttft, tail, frames = None, b"", 0
        while chunk := await reader.read(65536):
            if ttft is None and FIRST_TEXT[surface].search(tail[-64:] + chunk):
                ttft = time.perf_counter() - start
            frames += chunk.count(FRAME_END[surface])
            tail = (tail + chunk)[-4096:]  # the count is in the last chunk
            if keep and tail.endswith(CHUNKED_END):
                break
        counts = COUNT[surface].findall(tail)
        if not counts:
            raise SystemExit(f"stream {i} ended without a token count: {tail[-300:]!r}")
        answers.append((int(counts[-1]), ttft or 0.0, frames))
    writer.close()
    return answers


async def run(args) -> dict:
    url = urlsplit(args.url)
    addr = (url.hostname, url.port)
    start = time.perf_counter()
    each = await asyncio.gather(*(one(args, addr, i, i * args.stagger_ms / 1000) for i in range(args.streams)))
    wall = time.perf_counter() - start
    results = [r for answers in each for r in answers]
    ttfts = [r[1] for r in results]
    return {
        "streams": args.streams,
        "requests": len(results),
        "tokens": sum(r[0] for r in results),
        "tok_s": sum(r[0] for r in results) / wall,
        "ttft_worst_s": max(ttfts),
        "ttft_median_s": statistics.median(ttfts),
        "wall_s": wall,
        "frames": sum(r[2] for r in results),  # SSE events or NDJSON lines, each a chunk the server wrote
    }


def streams(
    url: str,
    n: int,
    tokens: int,
    surface: str = "openai",
    stagger_ms: float = 0.0,
    model: str = "bench",
    prompt: str | None = None,
    keep_alive: int = 1,
) -> dict:
    """This client run in a process of its own (it must not take the cores the server needs:
    httpx threads in a bench's own process did, and halved its figures); its figures."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), url, "--streams", str(n), "--tokens", str(tokens)]
        + ["--surface", surface, "--stagger-ms", str(stagger_ms), "--model", model]
        + (["--prompt", prompt] if prompt is not None else [])
        + ["--keep-alive", str(keep_alive)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--surface", choices=tuple(COUNT), default="openai")
    ap.add_argument("--stagger-ms", type=float, default=0.0)
    ap.add_argument("--model", default="bench")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--keep-alive", type=int, default=1, help="requests per stream on one connection")
    args = ap.parse_args()
    figures = asyncio.run(run(args))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    figures["client_cpu_s"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
