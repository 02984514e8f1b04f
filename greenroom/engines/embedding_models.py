"""Which placed models are embedding models — encoders that pool one vector per input and
generate nothing — told from their files without loading them, so that the front end
refuses chat and generation on them before any engine is asked (as Ollama refuses an
embedding-only model) and /api/show lists their one capability. Imports no torch."""

from __future__ import annotations

import functools
import json
import zipfile
from pathlib import Path

from .llama_cpp import gguf_meta
from .loader import GGUF_FROM, UNPACKED, source_path

# GGUF architectures that are encoders (llama.cpp's names): they embed, they do not generate
ENCODER_ARCHITECTURES = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "neo-bert", "modern-bert"})


@functools.lru_cache(maxsize=256)
def embedding_only(source: str, cache_dir: str | None) -> bool:
    """Whether the model of `source` is an embedding model: a sentence-transformers checkpoint
    (modules.json: its pooling is the model's own), a bare encoder body (config.json's
    architectures all `…Model`, none with a language-model head), a zipped one not unpacked
    yet, or a GGUF file of an encoder architecture or with a pooling type. A file that cannot
    be read is no embedding model here (its load says what is wrong). A GGUF written from a
    checkpoint (`gguf-from:`) is what that checkpoint is, written or not."""
    if source.startswith(GGUF_FROM):
        return embedding_only(source[len(GGUF_FROM) :], cache_dir)
    path = source_path(source, cache_dir)
    try:
        if path.is_dir():
            return (path / "modules.json").is_file() or _encoder_config(path / "config.json")
        if source.startswith(UNPACKED):  # its zip, not unpacked yet
            with zipfile.ZipFile(source_path(source[len(UNPACKED) :], cache_dir)) as archive:
                return "modules.json" in archive.namelist()
        if path.is_file():
            meta = gguf_meta.read(path)
            arch = meta.get("general.architecture")
            return arch in ENCODER_ARCHITECTURES or f"{arch}.pooling_type" in meta.fields
    except (OSError, ValueError, zipfile.BadZipFile):  # ValueError: gguf_meta.GGUFError too
        return False
    return False


def _encoder_config(config: Path) -> bool:
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return bool(architectures) and all(
        isinstance(a, str) and a.endswith("Model") and not a.endswith("LMHeadModel") for a in architectures
    )
