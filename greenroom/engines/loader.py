"""Engine construction from a model placement (config → engine instance). Runs in
the engine actor, so the front end never imports torch, even to build the demo model."""

from __future__ import annotations

from pathlib import Path

from .base import Engine


def source_path(source: str, cache_dir: str | None) -> Path:
    """Where a model source's checkpoint is, or will be once built: `demo:<size>` → the
    generated demo checkpoint's directory; else the path itself. Builds nothing."""
    if source.startswith("demo:"):
        from .demo_model import default_cache_dir, demo_model_dir

        return demo_model_dir(default_cache_dir(cache_dir), source[len("demo:"):])
    return Path(source).expanduser()


def resolve_source(source: str, cache_dir: str | None) -> Path:
    """The checkpoint of a model source, building the demo model on first use."""
    if source.startswith("demo:"):
        from .demo_model import default_cache_dir, ensure_demo_model

        return ensure_demo_model(default_cache_dir(cache_dir), source[len("demo:"):])
    path = source_path(source, cache_dir)
    if not path.exists():
        raise FileNotFoundError(f"model source {source!r} does not exist")
    return path


def load_engine(spec: dict) -> Engine:
    """`spec`: {"id", "source", "engine", "device", "dtype", "cache_dir"}."""
    path = resolve_source(spec["source"], spec.get("cache_dir"))
    if spec["engine"] == "transformers":
        from transformers.utils import logging as hf_logging

        from .transformers_engine import TransformersEngine

        hf_logging.disable_progress_bar()  # a server's log is no terminal

        return TransformersEngine(spec["id"], path, device=spec.get("device", "cpu"), dtype=spec.get("dtype"))
    raise ValueError(f"unknown engine {spec['engine']!r}")
