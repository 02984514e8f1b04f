"""Directories the project generates into the model cache (the demo checkpoint's GGUF and
OpenVINO conversions, the demo SAEs): built once under a lock shared by every process,
published with one rename, and rebuilt when their marker — what they were made from and by
which generator version — no longer matches."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "greenroom.json"


def ensure_built(out_dir: Path, marker: dict, build: Callable[[Path], None]) -> Path:
    """`out_dir`, made by `build(directory)` unless it is current; whoever waited on the lock
    finds the work done."""
    out_dir = Path(out_dir)
    if _is_current(out_dir, marker):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(out_dir, marker):
            _publish(out_dir, marker, build)
    return out_dir


def _is_current(out_dir: Path, marker: dict) -> bool:
    try:
        return json.loads((out_dir / MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False


def _publish(out_dir: Path, marker: dict, build: Callable[[Path], None]) -> None:
    # beside out_dir: the same filesystem, so the final rename is atomic
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        build(tmp)
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
