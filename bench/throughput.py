"""Throughput through `greenroom serve` against the same engine in process, side by side in one
run: N concurrent streams with continuous batching against `DecodeBatch` decoding the same N
prompts together. The client is bench/lean_client.py in a
process of its own (raw sockets, no JSON parsing); its CPU seconds are printed beside each
figure so a client-bound measurement shows. Every stream asks for the server's fixed sampling
parameters, so every one is batchable, on /v1 (SSE) and on Ollama's /api/chat (NDJSON).

    .venv/bin/python bench/throughput.py [--size tiny|100m] [--tokens 128] [--levels 1,32,64]
        [--ollama-levels 16] [--repeat 3] [--stagger-ms 0] [--chunks-per-s N] [--front-only]

The last columns: the engine's CPU milliseconds per token in process | the front end's and the
actors' through the server (the engine actor's among them, and its ratio to in process: the
actor's serving overhead), and the chunks the server wrote per token (pacing merges tokens
into chunks: the front end's cost goes mostly by the chunk, http/core/pacing.py).
`--front-only` skips the in-process reference: the served figures alone, quicker.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import attrs
import httpx

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine actors run (greenroom/actors/runtime.py)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.lean_client import streams  # noqa: E402
from bench.server import start_server  # noqa: E402
from greenroom.actors.scheduling import FIXED_SAMPLING  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model  # noqa: E402
from greenroom.engines.transformers.transformers_engine import TransformersEngine  # noqa: E402


def cpu_s(pid: int) -> float:
    """CPU seconds a process's threads have run, from each one's /proc schedstat (nanoseconds:
    /proc/<pid>/stat counts 10 ms ticks, and one stream's 128 tokens took one or two of them)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def tree_cpu(root: int, engine: int | None = None) -> dict[str, float]:
    """CPU seconds of the server's front end (the root process), of its actors together, and of
    the one among them that serves the bench's model (`engine`, where given: a share of "actors")."""
    children = [c for task in Path(f"/proc/{root}/task").iterdir() for c in (task / "children").read_text().split()]
    figures = {"front": cpu_s(root), "actors": sum(cpu_s(int(c)) for c in children)}
    return figures if engine is None else figures | {"engine": cpu_s(engine)}


def engine_pid(url: str) -> int:
    """The pid of the actor serving the bench's model (/api/actors): the engine's share of the
    actors' CPU, apart from the others' (the steering actor, an idle engine actor)."""
    return next(a["pid"] for a in httpx.get(url + "/api/actors").json()["actors"] if "bench" in a["models"])


def in_process(engine, n: int, tokens: int) -> float:
    """Tokens/s of the engine alone, and its CPU seconds per token: the same chat prompts the
    client sends, decoded together as the server's batch decodes them (one stream too: a server
    with continuous batching serves it in a batch of one; bench/stream_overhead.py measures the
    serial path against `generate`)."""
    params = attrs.evolve(FIXED_SAMPLING, max_tokens=tokens)
    prompts = [engine.render_chat([{"role": "user", "content": f"Story number {i}"}]) for i in range(n)]
    start, cpu = time.perf_counter(), time.process_time()
    batch = engine.new_batch(FIXED_SAMPLING)
    done = len(batch.join([(i, p, params) for i, p in enumerate(prompts)]))  # each one's first token
    while len(batch):
        done += len(batch.step())
    return done / (time.perf_counter() - start), (time.process_time() - cpu) / done


def over_http(url: str, pids: tuple[int, int], n: int, tokens: int, surface: str, stagger_ms: float) -> dict:
    """The lean client's figures, and the server's CPU milliseconds per token it used meanwhile
    (`pids`: the server's and its engine actor's)."""
    before = tree_cpu(*pids)
    figures = streams(url, n, tokens, surface, stagger_ms)
    after = tree_cpu(*pids)
    figures |= {f"{k}_ms": (after[k] - before[k]) * 1000 / figures["tokens"] for k in after}
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--levels", default="1,32,64")
    ap.add_argument("--ollama-levels", default="16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stagger-ms", type=float, default=0.0)
    ap.add_argument("--chunks-per-s", type=float, help="the server's stream_chunks_per_s (0: no pacing)")
    ap.add_argument("--front-only", action="store_true", help="no in-process reference: the served figures alone")
    args = ap.parse_args()
    runs = [("openai", int(n)) for n in args.levels.split(",") if n] + [
        ("ollama", int(n)) for n in args.ollama_levels.split(",") if n
    ]
    engine = None if args.front_only else TransformersEngine("bench", ensure_demo_model(default_cache_dir(), args.size))
    proc, url = start_server(
        f'log_level = "warning"\nmax_queue = {max(n for _, n in runs) * 2}\ncontinuous_batching = true\n'
        + (f"stream_chunks_per_s = {args.chunks_per_s}\n" if args.chunks_per_s is not None else "")
        + f'[[models]]\nid = "bench"\nsource = "demo:{args.size}"\n'
    )
    pids = (proc.pid, engine_pid(url))
    pacing = "server default" if args.chunks_per_s is None else args.chunks_per_s
    print(f"demo:{args.size}, {args.tokens} tokens per stream, median of {args.repeat} (interleaved), pacing {pacing}")
    print(
        f"{'surface':>8} {'streams':>7} {'in-process':>11} {'served':>9} {'ratio':>6} {'worst TTFT':>11} {'client CPU':>11}"
        "   ms/token: in process | front + actors (engine)   chunks/token"
    )
    reference = (lambda n: (math.nan, math.nan)) if args.front_only else (lambda n: in_process(engine, n, args.tokens))
    try:
        for surface, n in runs:
            reference(n), over_http(url, pids, n, args.tokens, surface, args.stagger_ms)
            local, served = [], []
            for _ in range(args.repeat):  # interleaved, so drift hits both alike
                local.append(reference(n))
                served.append(over_http(url, pids, n, args.tokens, surface, args.stagger_ms))
            mid = sorted(served, key=lambda r: r["tok_s"])[len(served) // 2]
            ref, ref_cpu = statistics.median(r[0] for r in local), statistics.median(r[1] for r in local)
            print(
                f"{surface:>8} {n:>7} {ref:>9.0f}/s {mid['tok_s']:>7.0f}/s {mid['tok_s'] / ref:>6.2f} "
                f"{mid['ttft_worst_s'] * 1000:>8.0f} ms {mid['client_cpu_s']:>9.2f} s   "
                f"{ref_cpu * 1000:.3f} | {mid['front_ms']:.3f} + {mid['actors_ms']:.3f}"
                f" (engine {mid['engine_ms']:.3f}, {mid['engine_ms'] / (ref_cpu * 1000):.2f}x)"
                f"   {mid['frames'] / mid['tokens']:.2f}"
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
