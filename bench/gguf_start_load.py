"""GGUF start and load times (issue 15, item 5), all measured in the same run:

1. start: `greenroom serve` (the front end alone: no engine actor) from the spawn to the first
   answer of /health, and to its "ok", with no GGUF file in `model_dirs` and with the 20 of
   tests/live/test_gguf_start.py (demo files, SmolLM2, sparse files of up to 70 GB, headers with
   262k- and 151k-token vocabularies), rounds interleaved; then the first and a second
   /api/tags (headers cached by path, size and mtime_ns).
2. load, in process: `llama_cpp.Llama(path, n_ctx, n_threads=1, verbose=False)` — with the
   engine's window, and with its whole cache (n_ctx × parallel cells) — against
   `LlamaCppEngine(...)` on the same file, repetitions interleaved, the engine's load broken
   into its parts (model, context, the end-of-generation scan, the chat template, the decode
   probe: measured at a file's first load, read from the cache root after).
3. live: `POST /api/models/load` until its 200 (the model's actor is spawned on demand and
   loads the engine) against the engine's construction alone.

    .venv/bin/python bench/gguf_start_load.py [--rounds 3] [--reps 5] [--n-ctx 4096] [--parallel 4] [--thp]

Run by hand, not in CI; the machine's other work moves every figure (compare within a run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_gguf_start import build_model_dir, smol_path  # noqa: E402  (the test's 20 files)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(config: str, cache: Path, env: dict | None = None) -> tuple[subprocess.Popen, str, float, float]:
    """A server; returns it, its URL, and the seconds from the spawn to /health's first answer and to ok."""
    port = free_port()
    cfg = Path(tempfile.mkdtemp()) / "bench.toml"
    cfg.write_text("defaults = false\n" + config)  # the server is this file alone, not over default.toml
    env = {**os.environ, "GREENROOM_CACHE": str(cache), "GREENROOM_OLLAMA_PORT": "0", **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenroom", "serve", "--port", str(port), "--config", str(cfg)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url, answered = f"http://127.0.0.1:{port}", None
    while proc.poll() is None and time.monotonic() - start < 300:
        try:
            status = httpx.get(url + "/health", timeout=2).json()["status"]
            answered = answered or time.monotonic() - start
            if status == "ok":
                return proc, url, answered, time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    proc.kill()
    raise SystemExit(f"the server did not become healthy (exit code {proc.poll()})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def med(xs: list[float]) -> float:
    return statistics.median(xs)


# --- 1. start ---------------------------------------------------------------------------------


def bench_start(work: Path, rounds: int) -> None:
    expected = build_model_dir(work / "twenty", work / "cache")
    (work / "empty").mkdir()
    rows: dict[str, dict[str, list[float]]] = {
        k: {"answered": [], "ok": [], "tags": [], "tags2": []} for k in ("0 files", "20 files")
    }
    for i in range(rounds):
        for kind, folder in (("0 files", "empty"), ("20 files", "twenty")):
            config = f'engine_actors = []\nnpu_actors = []\nmodel_dirs = ["{work / folder}"]\n'
            proc, url, answered, ok = serve(config, work / f"cache-start-{i}-{folder}")
            try:
                t = time.monotonic()
                listed = httpx.get(url + "/api/tags", timeout=120).json()["models"]
                tags = time.monotonic() - t
                t = time.monotonic()
                httpx.get(url + "/api/tags", timeout=120)
                tags2 = time.monotonic() - t
            finally:
                stop(proc)
            assert len(listed) == (len(expected) if folder == "twenty" else 0)
            for key, value in (("answered", answered), ("ok", ok), ("tags", tags), ("tags2", tags2)):
                rows[kind][key].append(value)
    print(f"\n## Start (the front end alone), median of {rounds} interleaved rounds\n")
    print("| model_dirs | /health first answer | /health ok | first /api/tags | second /api/tags |")
    print("| --- | --- | --- | --- | --- |")
    for kind, r in rows.items():
        print(
            f"| {kind} | {med(r['answered']):.2f} s | {med(r['ok']):.2f} s | {med(r['tags']) * 1e3:.0f} ms "
            f"| {med(r['tags2']) * 1e3:.0f} ms |"
        )
    delta = med(rows["20 files"]["answered"]) - med(rows["0 files"]["answered"])
    print(f"\n20 files − 0 files, first answer: {delta:+.2f} s (the goal: the whole start under 2 s)")


# --- 2. load, in process ---------------------------------------------------------------------


def bench_load(files: list[tuple[str, Path]], n_ctx: int, parallel: int, reps: int) -> dict[str, float]:
    """The table; returns each file's median engine construction (probe cached), for the live comparison."""
    import ctypes

    import llama_cpp
    import llama_cpp._internals as _internals

    from greenroom.engines.llama_cpp import llama_cpp_engine as lce

    parts: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    class TimedModel(_internals.LlamaModel):
        def __init__(self, *args, **kwargs):
            timed("model", super().__init__)(*args, **kwargs)

    lce._internals.LlamaModel = TimedModel  # the engine's model load, timed; restored below
    context, probe = lce.LlamaCppEngine._context, lce.LlamaCppEngine._decode_plan
    lce.LlamaCppEngine._context = timed("context", context)
    lce.LlamaCppEngine._decode_plan = timed("probe", probe)
    engines = {}
    print(
        f"\n## Load, in process: n_ctx {n_ctx}, parallel {parallel} (engine cache {n_ctx * parallel} cells), "
        f"1 thread, median of {reps} interleaved repetitions\n"
    )
    print(
        "| file | Llama(n_ctx) | Llama(n_ctx × parallel) | engine, first load | engine | ratio to Llama(n_ctx) "
        "| ratio to Llama(n_ctx × parallel) | engine's parts (median) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        for name, path in files:
            small, whole, first, engine, rows = [], [], None, [], []
            for rep in range(reps + 1):  # the first engine load probes; the others read its answer
                for cells, out in ((n_ctx, small), (n_ctx * parallel, whole)):
                    start = time.perf_counter()
                    llm = llama_cpp.Llama(str(path), n_ctx=cells, n_threads=1, verbose=False)
                    out.append(time.perf_counter() - start)
                    llm.close()
                parts.clear()
                start = time.perf_counter()
                e = lce.LlamaCppEngine(name, path, n_ctx=n_ctx, threads=1, parallel=parallel)
                total = time.perf_counter() - start
                # the parts timed apart, as __init__ runs them (the scan and the template on the loaded model)
                is_eog = ctypes.CFUNCTYPE(ctypes.c_bool)(
                    ctypes.cast(llama_cpp.llama_vocab_is_eog, ctypes.c_void_p).value
                )
                vocab, n = ctypes.c_void_p(e.model.vocab), e.vocab_size
                start = time.perf_counter()
                frozenset(t for t in range(n) if is_eog(vocab, t))
                parts["eog scan"] = time.perf_counter() - start
                source = e.model.metadata().get("tokenizer.chat_template")
                start = time.perf_counter()
                lce._environment().from_string(source) if source else None
                parts["template"] = time.perf_counter() - start
                parts["rest"] = (
                    total - parts["model"] - parts["context"] - parts["probe"] - parts["eog scan"] - parts["template"]
                )
                e.unload()
                if rep == 0:
                    first = total, dict(parts)
                    small.pop(), whole.pop()  # the first round warms the page cache: not counted
                else:
                    engine.append(total)
                    rows.append(dict(parts))
            engines[name] = med(engine)
            split = ", ".join(f"{k} {med([r[k] for r in rows]) * 1e3:.0f}" for k in rows[0])
            print(
                f"| {name} | {med(small) * 1e3:.0f} ms | {med(whole) * 1e3:.0f} ms | {first[0] * 1e3:.0f} ms "
                f"(probe {first[1]['probe'] * 1e3:.0f}) | {med(engine) * 1e3:.0f} ms "
                f"| {med(engine) / med(small):.2f} | {med(engine) / med(whole):.2f} | {split} ms |"
            )
    finally:
        lce._internals.LlamaModel = TimedModel.__mro__[1]
        lce.LlamaCppEngine._context, lce.LlamaCppEngine._decode_plan = context, probe
    return engines


# --- 3. live ------------------------------------------------------------------------------------


def bench_live(
    files: list[tuple[str, Path]], n_ctx: int, parallel: int, reps: int, cache: Path, engines: dict[str, float]
) -> None:
    models = "".join(
        f'[[models]]\nid = "{name}"\nsource = "{path}"\nengine = "llama.cpp"\nn_ctx = {n_ctx}\n' for name, path in files
    )
    config = f"engine_actors = []\nnpu_actors = []\ngguf_threads = 1\ngguf_parallel = {parallel}\n" + models
    proc, url, _, _ = serve(config, cache)
    loads: dict[str, list[float]] = {name: [] for name, _ in files}
    try:
        for _ in range(reps):
            for name, _ in files:
                start = time.monotonic()
                r = httpx.post(url + "/api/models/load", json={"model": name}, timeout=300)
                loads[name].append(time.monotonic() - start)
                assert r.status_code == 200, r.text
                assert httpx.post(url + "/api/models/unload", json={"model": name}, timeout=300).status_code == 200
    finally:
        stop(proc)
    print(f"\n## Live load: POST /api/models/load → 200 (the actor spawned on demand), median of {reps}\n")
    print("| file | live load | engine construction alone | the actor's share |")
    print("| --- | --- | --- | --- |")
    for name, _ in files:
        live = med(loads[name])
        print(
            f"| {name} | {live * 1e3:.0f} ms | {engines[name] * 1e3:.0f} ms | {(live - engines[name]) * 1e3:.0f} ms |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="start rounds (each: one server of each kind)")
    parser.add_argument("--reps", type=int, default=5, help="load repetitions")
    parser.add_argument("--n-ctx", type=int, default=4096, help="the engine's window (gguf_n_ctx's default)")
    parser.add_argument("--parallel", type=int, default=4, help="sequences (gguf_parallel's default)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["start", "load", "live"])
    parser.add_argument(
        "--thp",
        action="store_true",
        help="then the load table again in a process whose malloc maps transparent huge pages "
        "(GLIBC_TUNABLES=glibc.malloc.hugetlb=1): llama.cpp clears its KV cache at creation, "
        "and the page faults of that first touch are most of a context's cost",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gguf-start-load-"))
    # one cache root for all: the demo files, and the decode probe's answers (engine and live server alike)
    os.environ["GREENROOM_CACHE"] = str(work / "cache")
    try:
        if "start" not in args.skip:
            bench_start(work, args.rounds)
        from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
        from greenroom.engines.demo.demo_model import default_cache_dir

        files = [
            ("smollm2-135m:Q4_1", smol_path()),
            ("demo-tiny:Q8_0", ensure_demo_gguf(default_cache_dir(work / "cache"), "Q8_0")),
        ]
        engines = bench_load(files, args.n_ctx, args.parallel, args.reps) if "load" not in args.skip else {}
        if "live" not in args.skip and engines:
            bench_live(files, args.n_ctx, args.parallel, args.reps, work / "cache", engines)
        if args.thp:
            print("\n### The same, with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (Llama() and the engine alike)")
            sys.stdout.flush()
            subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--skip",
                    "start",
                    "live",
                    "--reps",
                    str(args.reps),
                    "--n-ctx",
                    str(args.n_ctx),
                    "--parallel",
                    str(args.parallel),
                ],
                check=True,
                env={**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
            )
        probe = Path(os.environ["GREENROOM_CACHE"]) / "models" / "llama-cpp-decode.json"
        if probe.is_file():
            print(
                "\ndecode probe answers:",
                json.dumps({k.split("|")[0].rsplit("/", 1)[-1]: v for k, v in json.loads(probe.read_text()).items()}),
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
