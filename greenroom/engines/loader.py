"""Engine construction from a model placement (config → engine instance). Runs in
the engine actor, so the front end never imports torch, even to build the demo model."""

from __future__ import annotations

from pathlib import Path

from .base import Engine


def resolve_source(source: str, cache_dir: str | None) -> Path:
    """`demo:<size>` → the generated demo checkpoint (built on first use); else a path."""
    if source.startswith("demo:"):
        from .demo_model import default_cache_dir, ensure_demo_model

        return ensure_demo_model(default_cache_dir(cache_dir), source[len("demo:"):])
    path = Path(source).expanduser()
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
