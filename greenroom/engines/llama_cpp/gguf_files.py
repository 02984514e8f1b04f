"""GGUF files on disk → model names. A GGUF model is named `repo:QUANT`: the repository
is the folder holding the file (relative to the model directory, e.g.
`bartowski/Llama-3.2-1B-Instruct-GGUF`), or the file's stem without its quantization
suffix when it lies in the model directory itself; QUANT comes from the file's
`general.file_type`, never from its name. Reads the header only (gguf_meta.py): the
front end calls this without loading llama.cpp."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from ..built_dirs import MARKER
from . import gguf_meta

# later parts of a split model are loaded through the first one
_LATER_SPLIT = re.compile(r"-0*([2-9]|\d{2,})-of-\d+\.gguf$")


def quant_label(path: str | Path, metadata: Mapping | None = None) -> str:
    """`Q4_K_M`, `F16`, … from `general.file_type` (gguf_meta.file_type_label). `metadata`:
    the file's key/values already read — llama.cpp's own, as the loaded engine has them —
    so the header is not read again."""
    if metadata is not None:
        return gguf_meta.file_type_name(metadata.get("general.file_type"))
    return gguf_meta.file_type_label(gguf_meta.read(path))


_FIRST_SPLIT = re.compile(r"-(0*1)-of-(\d+)\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """Every file of a model split by llama.cpp's gguf-split (`…-00001-of-00003.gguf`),
    named from its first one; `[path]` for a model in one file."""
    m = _FIRST_SPLIT.search(path.name)
    if m is None:
        return [path]
    prefix, width, n = path.name[: m.start()], len(m.group(1)), int(m.group(2))
    return [path.with_name(f"{prefix}-{i:0{width}d}-of-{m.group(2)}.gguf") for i in range(1, n + 1)]


def repo_name(path: Path, root: Path, quant: str) -> str:
    rel = path.relative_to(root)
    if len(rel.parts) > 1:
        return rel.parent.as_posix()
    stem = re.sub(r"-0*1-of-\d+$", "", path.stem)
    return re.sub(rf"[.\-_]{re.escape(quant)}$", "", stem, flags=re.IGNORECASE) or stem


def discover(dirs: list[str | Path]) -> list[tuple[str, Path]]:
    """(`repo:QUANT`, file) for every GGUF model below `dirs`, sorted by name; a file
    that is not a readable GGUF is skipped (logged by the caller's absence of it)."""
    found: dict[str, Path] = {}
    for root in map(lambda d: Path(d).expanduser(), dirs):
        for path in sorted(root.rglob("*.gguf")) if root.is_dir() else []:
            if _LATER_SPLIT.search(path.name):
                continue
            try:
                quant = quant_label(path)
            except (OSError, gguf_meta.GGUFError):
                continue
            found.setdefault(f"{repo_name(path, root, quant)}:{quant}", path)
    return sorted(found.items())


def revision(path: Path) -> str | None:
    """What records the file's version: a Hugging Face cache snapshot's commit, or the demo
    generator's versions (its marker); else None, written "unrecorded" — never the file's
    `general.name`, which names the model, not a revision of it."""
    path = Path(path)
    if path.parent.parent.name == "snapshots":
        return path.parent.name[:8]
    try:
        meta = json.loads((path.parent / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or "generator_version" not in meta:
        return None
    return f"demo-{meta.get('size')}-v{meta['generator_version']}-c{meta.get('converter_version')}"
