"""A BERT sentence-embedding checkpoint (a `BertModel` folder: all-MiniLM-L6-v2) → one F16 GGUF
file of llama.cpp's `bert` architecture, written with the `gguf` package in numpy as the demo
GGUFs are (demo/demo_gguf.py): the weights under llama.cpp's tensor names (`tensor_name`), the
WordPiece vocabulary as llama.cpp's WPM tokenizer reads it (`wordpiece_vocab`), and the pooling
the checkpoint asks for (text/pooling.py read_pooling) as `bert.pooling_type`. llama.cpp has no
key for a Normalize module: the file says it under NORMALIZE_KEY, which the llama.cpp engine reads.

`greenroom convert --to-gguf` writes one; the `gguf-from:<source>` model source writes it once
into the model cache (`ensure_bert_gguf`) and is rebuilt when the checkpoint or this converter
changes. Seconds for all-MiniLM-L6-v2 (90 MB of float32 weights → a 45 MB file).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ..built_dirs import ensure_built
from ..text.pooling import read_pooling
from .gguf_write import write_file

ARCH = "bert"
# bump when the written file would change; cached files of another version are rewritten
CONVERTER_VERSION = 1
GGUF_DIR = "gguf-from"
NORMALIZE_KEY = "greenroom.embedding.normalize"  # bool: the pooled vector is L2-normalised
# read_pooling's modes → llama.cpp's pooling types (gguf.PoolingType); llama.cpp has no max pooling
POOLING_TYPES = {"mean": 1, "cls": 2, "lasttoken": 3}

# checkpoint tensor → llama.cpp's (gguf-py's tensor map for `bert`)
_EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_LAYER_TENSOR = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
# not in the file: a buffer of position ids, and BERT's pooler (sentence-transformers pools itself)
_LEFT_OUT = ("embeddings.position_ids", "pooler.")
# kept float32 as llama.cpp's converter keeps them: vectors, and the token-type rows the graph adds as they are
_FLOAT32 = ("token_types.weight",)


def tensor_name(name: str) -> str | None:
    """llama.cpp's name for the checkpoint tensor `name` (a `bert.` prefix allowed); None for one
    the file leaves out. ValueError for a tensor llama.cpp's `bert` has no place for."""
    name = name.removeprefix("bert.")
    if name.startswith(_LEFT_OUT):
        return None
    if name in _EMBEDDINGS:
        return _EMBEDDINGS[name]
    match = _LAYER_TENSOR.fullmatch(name)
    if match and match[2] in _LAYER:
        return f"blk.{match[1]}.{_LAYER[match[2]]}.{match[3]}"
    raise ValueError(f"tensor {name!r} has no place in llama.cpp's {ARCH} architecture")


def wordpiece_vocab(tokenizer: dict) -> tuple[list[str], list[int]]:
    """(token texts by id, gguf TokenType values) of a tokenizer.json's WordPiece model, as
    llama.cpp's WPM tokenizer looks words up: a word-initial piece carries the phantom space
    "▁" it prefixes every word with, a continuation piece loses its "##"; added tokens stay as
    written — CONTROL where special, USER_DEFINED otherwise. Ids nothing names are UNUSED."""
    import gguf

    model = tokenizer.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ValueError(f"the tokenizer is {model.get('type')!r}, not WordPiece: llama.cpp's bert reads WordPiece")
    prefix = model.get("continuing_subword_prefix", "##")
    added = {t["id"]: t for t in tokenizer.get("added_tokens", [])}
    size = max([*model["vocab"].values(), *added]) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in model["vocab"].items():
        tokens[i] = text[len(prefix) :] if text.startswith(prefix) else "\u2581" + text
        types[i] = gguf.TokenType.NORMAL
    for i, token in added.items():
        tokens[i] = token["content"]
        types[i] = gguf.TokenType.CONTROL if token.get("special") else gguf.TokenType.USER_DEFINED
    return tokens, [int(t) for t in types]


def special_ids(tokenizer: dict, tokenizer_config: dict) -> dict[str, int]:
    """The ids of the checkpoint's [CLS], [SEP], [UNK], [PAD] and [MASK] (by the names its
    tokenizer_config.json gives them), those it has."""
    ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])} | tokenizer["model"]["vocab"]
    roles = {}
    for role in ("cls", "sep", "unk", "pad", "mask"):
        text = tokenizer_config.get(f"{role}_token")
        text = text.get("content") if isinstance(text, dict) else text
        if text in ids:
            roles[role] = ids[text]
    return roles


def write_bert_gguf(checkpoint: str | Path, out: str | Path) -> Path:
    """Write the F16 GGUF of the BertModel checkpoint folder `checkpoint` to the file `out`.
    ValueError for a checkpoint this cannot write as llama.cpp would run it (another
    architecture, a tokenizer that is not an uncased-or-cased WordPiece, max pooling)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    checkpoint, out = Path(checkpoint).expanduser(), Path(out).expanduser()
    config = _json(checkpoint / "config.json")
    if config.get("architectures") != ["BertModel"] or config.get("model_type") != "bert":
        raise ValueError(
            f"{checkpoint} is a {config.get('architectures')} checkpoint: only BertModel is written as GGUF"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{checkpoint}: llama.cpp's bert has absolute position embeddings only")
    pooling = read_pooling(checkpoint)
    if pooling.mode not in POOLING_TYPES:
        raise ValueError(f"{checkpoint} pools by {pooling.mode!r}, which llama.cpp has no pooling type for")
    tokenizer = _json(checkpoint / "tokenizer.json")
    tokenizer_config = _json(checkpoint / "tokenizer_config.json", missing_ok=True)
    tokens, types = wordpiece_vocab(tokenizer)
    roles = special_ids(tokenizer, tokenizer_config)
    if "cls" not in roles or "sep" not in roles:
        raise ValueError(f"{checkpoint}'s tokenizer names no [CLS] and [SEP] token")
    lowercase, strip_accents = _normalizer(tokenizer)

    w = gguf.GGUFWriter(out, ARCH)
    w.add_name(checkpoint.name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_layer_norm_eps(float(config["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(POOLING_TYPES[pooling.mode]))
    w.add_bool(NORMALIZE_KEY, pooling.normalize)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))

    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(config.get("type_vocab_size", 1))
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    w.add_bool("tokenizer.ggml.normalizer.strip_accents", strip_accents)
    # llama.cpp's WPM: BOS is [CLS]; [SEP] closes every input (add_sep), as the checkpoint's template does
    w.add_bos_token_id(roles["cls"])
    w.add_uint32("tokenizer.ggml.cls_token_id", roles["cls"])  # gguf-py has no writer for it
    w.add_sep_token_id(roles["sep"])
    for role, add in (("unk", w.add_unk_token_id), ("pad", w.add_pad_token_id), ("mask", w.add_mask_token_id)):
        if role in roles:
            add(roles[role])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
    w.add_add_eos_token(False)

    weights = load_file(checkpoint / "model.safetensors")
    written = set()
    for name in sorted(weights):
        target = tensor_name(name)
        if target is None:
            continue
        data = np.ascontiguousarray(weights[name], dtype=np.float32)
        if data.ndim > 1 and target not in _FLOAT32:
            w.add_tensor(target, data.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
        else:
            w.add_tensor(target, data)
        written.add(target)
    wanted = set(_EMBEDDINGS.values()) | {
        f"blk.{i}.{t}.{p}"
        for i in range(config["num_hidden_layers"])
        for t in _LAYER.values()
        for p in ("weight", "bias")
    }
    if written != wanted:
        w.close()
        out.unlink(missing_ok=True)
        raise ValueError(f"{checkpoint}: the checkpoint lacks {sorted(wanted - written)[:5]}")

    return write_file(w, out)


def bert_gguf_path(cache_dir: Path, checkpoint: Path) -> Path:
    """Where the GGUF of the checkpoint folder `checkpoint` lives in the cache (written or not):
    named for the folder and a hash of its path, so two folders of one name do not share it."""
    checkpoint = Path(checkpoint).expanduser().absolute()
    digest = hashlib.sha256(str(checkpoint).encode()).hexdigest()[:10]
    return Path(cache_dir) / GGUF_DIR / f"{checkpoint.name}-{digest}" / f"{checkpoint.name}-F16.gguf"


def ensure_bert_gguf(cache_dir: Path, checkpoint: Path) -> Path:
    """The cached GGUF of `checkpoint`, written on first use and again when its weights change
    (size or modification time) or the converter does."""
    checkpoint = Path(checkpoint).expanduser().absolute()
    stat = (checkpoint / "model.safetensors").stat()
    marker = {
        "converter_version": CONVERTER_VERSION,
        "checkpoint": str(checkpoint),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }
    path = bert_gguf_path(cache_dir, checkpoint)
    ensure_built(path.parent, marker, lambda out: write_bert_gguf(checkpoint, out / path.name))
    return path


def _normalizer(tokenizer: dict) -> tuple[bool, bool]:
    """(lowercase, strip accents) of a BertNormalizer, as llama.cpp's WPM normalizer takes them
    (strip_accents unset follows lowercase, as in BERT's own tokenizer)."""
    norm = tokenizer.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        raise ValueError(f"the tokenizer's normalizer is {norm.get('type')!r}, not BertNormalizer")
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    return lowercase, lowercase if strip is None else bool(strip)


def _json(path: Path, missing_ok: bool = False) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise ValueError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is unreadable: {exc}") from None
