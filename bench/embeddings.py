"""Embeddings throughput: 128 inputs of ~40 tokens in one request, through greenroom's /api/embed
and /v1/embeddings, against the same engine in this process (`engine.embed` on the inputs
tokenised, the engine actor's path) and, for a GGUF, against the real llama-server's
/v1/embeddings on the same file (built as bench/gguf_vs_peer.py's docstring says).

Any model of the default config (configs/default.toml) by its id: its source, engine and actor
are read from there, so one script measures all-minilm on each engine:

    .venv/bin/python bench/embeddings.py --model all-minilm:f16 --llama-server /tmp/lsrv/build/bin/llama-server
    .venv/bin/python bench/embeddings.py --model all-minilm:transformers
    .venv/bin/python bench/embeddings.py --model all-minilm        # OpenVINO on npu0 (the CPU stands in)
        [--inputs 128] [--rounds 5] [--threads 1] [--slots 8]    # 0: each side's own default

Every server stays up and each round measures them all in turn (after a warm request each):
medians are printed, and each round's ratios, which the machine's drift moves far less. The
acceptance: greenroom's /api/embed ≥ 0.9 × in process; ≥ 1.0 × llama-server (same threads; with
`--threads 0` each side computes on its own default: greenroom's embedding decodes and llama-server
both on every core).
Beside each wall-clock figure, the CPU seconds a request cost its side (this process's for the
engine in process; the server's whole process tree, front end and actors; llama-server's), from
/proc as bench/throughput.py reads them: on a loaded machine they move far less than the clock.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from functools import partial
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as greenroom's actors run

from bench.gguf_vs_peer import _free_port, _started  # noqa: E402
from bench.server import start_server  # noqa: E402
from bench.throughput import cpu_s, tree_cpu  # noqa: E402
from greenroom.engines.loader import load_engine, resolve_source  # noqa: E402
from greenroom.supervisor.placements import device_of  # noqa: E402

WORDS = (
    "the a river city night music garden old quiet bright engine letter winter market bridge story window "
    "mountain teacher coffee silver ocean paper forest morning train yellow doctor island careful journey"
).split()


def inputs(n: int, words: int) -> list[str]:
    """`n` distinct sentences of `words` words (all-MiniLM: 36 words are ~40 tokens), deterministic."""
    return [" ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(words)) + "." for i in range(n)]


def entry(model: str) -> dict:
    """The model's [[models]] entry in the default config."""
    config = tomllib.loads((ROOT / "configs" / "default.toml").read_text())
    for m in config["models"]:
        if m["id"] == model:
            return m
    raise SystemExit(f"{model!r} is not a model of configs/default.toml")


def served_config(m: dict, threads: int) -> str:
    """The bench server's TOML: the entry alone, preloaded, its engine on `threads` threads (0: its default)."""
    keys = {**m, "preload": True}
    if m.get("engine") == "llama.cpp" and threads:
        keys["threads"] = threads
    lines = [f"{k} = {json.dumps(v)}" for k, v in keys.items()]  # JSON's strings, numbers and booleans are TOML's
    return 'engine_actors = ["cpu"]\nnpu_actors = "auto"\n\n[[models]]\n' + "\n".join(lines) + "\n"


def start_llama_server(binary: str, path: Path, threads: int, slots: int) -> tuple[subprocess.Popen, str]:
    """llama-server in embeddings mode on the file: mean pooling (the model's own), `slots` slots
    of the model's 512-token window, so it too decodes many inputs together; `threads` 0: its
    default (every physical core); `slots` 0: its default (4 here)."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-m", str(path), "--embeddings", "--pooling", "mean"]
        + (["-t", str(threads), "-tb", str(threads)] if threads else [])
        + (["-c", str(512 * slots), "-np", str(slots)] if slots else [])
        + ["-b", "2048", "-ub", "512"]
        + ["--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _started(proc, f"http://127.0.0.1:{port}", "/health", "llama-server")


def timed_post(url: str, body: dict) -> None:
    """The request sent and the whole response body read (not parsed)."""
    r = httpx.post(url, json=body, timeout=600)
    r.read()
    if r.status_code != 200:
        raise SystemExit(f"{url} answered {r.status_code}: {r.text[:300]}")


def measured(call, cpu) -> tuple[float, float]:
    """Wall-clock seconds of `call()` and the CPU seconds `cpu()` (a side's running total) grew by."""
    start, used = time.perf_counter(), cpu()
    call()
    return time.perf_counter() - start, cpu() - used


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="all-minilm:f16", help="a model id of configs/default.toml")
    ap.add_argument("--inputs", type=int, default=128)
    ap.add_argument("--words", type=int, default=36)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="each side's compute threads; 0: each side's default")
    ap.add_argument("--slots", type=int, default=8, help="llama-server's slots; 0: its default")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    args = ap.parse_args()
    m = entry(args.model)
    texts = inputs(args.inputs, args.words)
    spec = {
        "id": m["id"],
        "source": m["source"],
        "engine": m.get("engine", "transformers"),
        "device": device_of(m.get("actor", "cpu")),
        "threads": args.threads,
    }
    engine = load_engine(spec)
    tokens = sum(len(engine.tokenize(t)) for t in texts)
    print(
        f"{m['id']} ({spec['engine']} on {spec['device']}), {args.inputs} inputs of {tokens / args.inputs:.1f} "
        f"tokens, {args.threads or 'default'} thread(s); medians of {args.rounds} rounds"
    )

    def in_process() -> None:
        engine.embed([engine.tokenize(t) for t in texts])

    servers = [("greenroom", lambda: start_server(served_config(m, args.threads)), signal.SIGTERM)]
    if args.llama_server and spec["engine"] == "llama.cpp":
        path = resolve_source(m["source"], None)
        servers.append(
            (
                "llama-server",
                lambda: start_llama_server(args.llama_server, path, args.threads, args.slots),
                signal.SIGINT,
            )
        )
    running, times, cpus = [], {}, {}
    try:
        for name, start, stop in servers:
            proc, url = start()
            running.append((name, proc, url, stop))
        calls = {"in process": (in_process, time.process_time)}
        for name, proc, url, _ in running:
            cpu = (
                (lambda pid=proc.pid: sum(tree_cpu(pid).values())) if name == "greenroom" else partial(cpu_s, proc.pid)
            )
            if name == "greenroom":
                calls["greenroom /api/embed"] = (
                    partial(timed_post, url + "/api/embed", {"model": m["id"], "input": texts}),
                    cpu,
                )
            body = {"model": m["id"], "input": texts, "encoding_format": "float"}
            calls[f"{name} /v1/embeddings"] = (partial(timed_post, url + "/v1/embeddings", body), cpu)
        for call, _ in calls.values():  # warm: loaded, buffers sized
            call()
        for _ in range(args.rounds):
            for name, (call, cpu) in calls.items():
                wall, used = measured(call, cpu)
                times.setdefault(name, []).append(wall)
                cpus.setdefault(name, []).append(used)
    finally:
        for _, proc, _, stop in running:
            proc.send_signal(stop)
            proc.wait(60)
    rate = {name: [tokens / t for t in ts] for name, ts in times.items()}
    base = statistics.median(rate["in process"])
    cpu_base = statistics.median(cpus["in process"])
    print(f"{'':>28} {'ms':>8} {'tokens/s':>9} {'vs in process':>14} {'CPU ms':>8} {'CPU vs in process':>18}")
    for name, ts in times.items():
        r, cpu = statistics.median(rate[name]), statistics.median(cpus[name])
        print(
            f"{name:>28} {statistics.median(ts) * 1e3:8.1f} {r:9.0f} {r / base:14.2f} {cpu * 1e3:8.0f} {cpu_base / cpu:18.2f}"
        )
    pairs = [("greenroom /api/embed", "in process"), ("greenroom /v1/embeddings", "in process")]
    if "llama-server /v1/embeddings" in rate:
        pairs += [
            ("greenroom /v1/embeddings", "llama-server /v1/embeddings"),
            ("greenroom /api/embed", "llama-server /v1/embeddings"),
        ]
    for a, b in pairs:
        by_round = [x / y for x, y in zip(rate[a], rate[b])]
        print(
            f"{a} / {b}: median {statistics.median(by_round):.2f}, by round " + " ".join(f"{x:.2f}" for x in by_round)
        )
        print(f"    in CPU seconds: {statistics.median(cpus[b]) / statistics.median(cpus[a]):.2f}")


if __name__ == "__main__":
    main()
