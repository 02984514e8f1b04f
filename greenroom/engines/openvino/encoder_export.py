"""A sentence-transformers checkpoint (all-MiniLM-L6-v2: a BertModel with modules.json) as
OpenVINO IR for TextEmbeddingPipeline, exported once into the model cache as the demo's IR is
(engines/demo/demo_openvino.py): OpenVINO's converter over the torch model, openvino-tokenizers
for its tokenizer and detokenizer, no optimum-intel. About three seconds for MiniLM; the files
are those optimum-cli's feature-extraction export writes (openvino_model.xml with inputs
input_ids, attention_mask[, token_type_ids] and output last_hidden_state, beside the tokenizer
IRs), and the checkpoint's configs and sentence-transformers modules are copied with them, so
the directory says its own pooling (engines/text/pooling.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..built_dirs import ensure_built
from ..text.pooling import read_pooling

# bump when the export writes different files
CONVERTER_VERSION = 1
OPENVINO_DIR = "openvino"
# the checkpoint's files copied beside the IR: its configs, its tokenizer's, its sentence-transformers modules
_COPIED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)


def is_encoder_checkpoint(path: Path) -> bool:
    """A transformers checkpoint folder (config.json, safetensors) of a sentence-transformers
    embedding model, which the OpenVINO engine exports before it serves it."""
    path = Path(path)
    return (
        path.is_dir()
        and not (path / "openvino_model.xml").exists()
        and (path / "config.json").is_file()
        and (path / "modules.json").is_file()
    )


def openvino_dir(cache_dir: Path, checkpoint: Path) -> Path:
    """Where `checkpoint`'s IR lives in the cache (exported or not): named for its folder and a
    hash of its path, so two checkpoints of one name do not share it."""
    checkpoint = Path(checkpoint).expanduser().absolute()
    digest = hashlib.sha256(str(checkpoint).encode()).hexdigest()[:10]
    return Path(cache_dir) / OPENVINO_DIR / f"{checkpoint.name}-{digest}"


def ensure_encoder_ir(cache_dir: Path, checkpoint: Path) -> Path:
    """`checkpoint`'s IR directory, exported on first use and again when the checkpoint's files
    change (export_marker). ValueError for a checkpoint the export cannot take."""
    checkpoint = Path(checkpoint).expanduser().absolute()
    read_pooling(checkpoint)  # a pooling no engine can honour is refused before any export
    return ensure_built(
        openvino_dir(cache_dir, checkpoint), export_marker(checkpoint), lambda out: export_encoder(checkpoint, out)
    )


def export_marker(checkpoint: Path) -> dict:
    """What an export is made from: the checkpoint's path, each of its files' size and mtime,
    and the converter's version."""
    checkpoint = Path(checkpoint).expanduser().absolute()
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    return {
        "checkpoint": str(checkpoint),
        "files": {str(p.relative_to(checkpoint)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files},
        "converter_version": CONVERTER_VERSION,
    }


def export_encoder(checkpoint: Path, out: Path) -> Path:
    """Write the encoder of `checkpoint` (transformers' AutoModel: its last hidden state, no
    pooling — TextEmbeddingPipeline pools) and its tokenizer into `out` as OpenVINO IR."""
    import openvino as ov
    import torch
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    # eager attention: matmuls and a softmax, which every device compiles (the seed's NPU plugin
    # refused a model's SDPA nodes); OpenVINO's CPU plugin fuses them back into its attention
    model = AutoModel.from_pretrained(checkpoint, attn_implementation="eager", dtype=torch.float32).eval()
    example = dict(tokenizer(["an example", "and a longer example"], padding=True, return_tensors="pt"))
    with torch.no_grad():
        traced = ov.convert_model(model, example_input=example)
    # the last hidden state alone (BertModel's pooler output is no sentence-transformers pooling)
    graph = ov.Model([traced.output("last_hidden_state")], traced.get_parameters(), "greenroom-encoder")
    # float32 kept as is: the IR computes what the checkpoint does (save_model would halve it)
    ov.save_model(graph, out / "openvino_model.xml", compress_to_fp16=False)
    ov_tokenizer, ov_detokenizer = convert_tokenizer(tokenizer, with_detokenizer=True)
    ov.save_model(ov_tokenizer, out / "openvino_tokenizer.xml")
    ov.save_model(ov_detokenizer, out / "openvino_detokenizer.xml")
    for name in _COPIED:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, out / name)
    for module in json.loads((checkpoint / "modules.json").read_text()):
        folder = str(module.get("path", "")) if isinstance(module, dict) else ""
        inside = (checkpoint / folder).resolve().is_relative_to(checkpoint.resolve())
        if folder and inside and (checkpoint / folder).is_dir():  # 1_Pooling/config.json, …
            shutil.copytree(checkpoint / folder, out / folder)
    for path in out.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return out
