"""all-minilm on the OpenVINO engine: 128 inputs of ~40 tokens in one request through greenroom's
/api/embed and /v1/embeddings, against the same engine in this process — `embed_texts`, the
engine actor's path for text inputs (TextEmbeddingPipeline, 8 texts a call; on the NPU actor its
static-shape profile) — and against TextEmbeddingPipeline alone, called as the engine calls it.

    .venv/bin/python bench/embeddings_openvino.py [--actor npu0|cpu] [--inputs 128] [--rounds 5]

npu0 is the default config's placement (the CPU stands in for an NPU here: static shapes of
256 tokens a row); cpu runs the CPU device's dynamic shapes. The server is started with the
model preloaded; each round times every path in turn after one warm call each, and prints the
medians and each round's ratio to the in-process engine (the acceptance: /api/embed ≥ 0.9×).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as greenroom's actors run

from bench.server import start_server  # noqa: E402
from greenroom.engines.loader import load_engine  # noqa: E402
from greenroom.engines.openvino.text_embedding import calls  # noqa: E402
from greenroom.supervisor.placements import device_of  # noqa: E402

MODEL = "all-minilm"
SOURCE = "unpacked:package:all_minilm_l6_v2/model.zip"
SUBJECTS = "the lighthouse keeper|a small bakery|the night train|our garden|the old library|a mountain village".split(
    "|"
)


def sentences(n: int) -> list[str]:
    """`n` distinct sentences of ~40 MiniLM tokens, deterministic."""
    return [
        f"In the story number {i}, {SUBJECTS[i % len(SUBJECTS)]} waited through a long and quiet winter "
        f"for news from the coast, while letters arrived every week with careful descriptions of storms, ships and the harbour lights."
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--actor", default="npu0", choices=("npu0", "cpu"))
    ap.add_argument("--inputs", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    texts = sentences(args.inputs)
    spec = {"id": MODEL, "source": SOURCE, "engine": "openvino", "device": device_of(args.actor)}
    engine = load_engine(spec)
    tokens = sum(len(engine.tokenize(t)) for t in texts)
    embedder = engine.embedder

    def pipeline_alone() -> None:  # TextEmbeddingPipeline's calls as the engine makes them, nothing around them
        for start, stop, rows in calls(len(texts), embedder.static_length is not None):
            chunk = texts[start:stop]
            embedder._pipeline(rows).embed_documents(chunk + chunk[-1:] * ((rows or len(chunk)) - len(chunk)))

    proc, url = start_server(
        f'[[models]]\nid = "{MODEL}"\nsource = "{SOURCE}"\nengine = "openvino"\nactor = "{args.actor}"\n'
    )

    def post(path: str, body: dict):
        def call() -> None:
            r = httpx.post(url + path, json={"model": MODEL, **body}, timeout=600)
            if r.status_code != 200:
                raise SystemExit(f"{path} answered {r.status_code}: {r.text[:300]}")

        return call

    paths = {
        "in process (embed_texts)": lambda: engine.embed_texts(texts),
        "TextEmbeddingPipeline alone": pipeline_alone,
        "greenroom /api/embed": post("/api/embed", {"input": texts}),
        "greenroom /v1/embeddings": post("/v1/embeddings", {"input": texts, "encoding_format": "float"}),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for call in paths.values():  # warm: loaded, shapes compiled
            call()
        for _ in range(args.rounds):
            for name, call in paths.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(
        f"{MODEL} (openvino on {spec['device']}: {engine.info.device} computes, {engine.info.dtype}), "
        f"{args.inputs} inputs of {tokens / args.inputs:.1f} tokens; medians of {args.rounds} rounds"
    )
    base = times["in process (embed_texts)"]
    print(f"{'':>28} {'ms':>8} {'inputs/s':>9} {'vs in process':>14}")
    for name, ts in times.items():
        by_round = [b / t for b, t in zip(base, ts, strict=True)]
        print(
            f"{name:>28} {statistics.median(ts) * 1e3:8.1f} {args.inputs / statistics.median(ts):9.1f} "
            f"{statistics.median(by_round):14.2f}  by round " + " ".join(f"{x:.2f}" for x in by_round)
        )


if __name__ == "__main__":
    main()
