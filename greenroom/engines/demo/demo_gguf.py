"""The demo model as GGUF files, for the llama.cpp engine: the same weights, tokenizer
and chat template as the Hugging Face demo checkpoint (demo_model.py), converted with
the `gguf` package in pure numpy — F16 and two quantized types, deterministic, in about
a second. Both engines therefore tokenise identically and, at F16, answer alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..built_dirs import ensure_built
from ..llama_cpp.gguf_write import write_file
from .demo_model import DEMO_MODEL_NAME, GENERATOR_VERSION, SIZES, TOOL_CALL_TAGS, ensure_demo_model

DEMO_GGUF_REPO = f"{DEMO_MODEL_NAME}-gguf"
QUANTS = ("F16", "Q8_0", "Q4_0")
# bump when the conversion writes different files (the checkpoint's own version is in the marker too)
CONVERTER_VERSION = 1


def demo_gguf_dir(cache_dir: Path, size: str = "tiny") -> Path:
    return Path(cache_dir) / f"{DEMO_GGUF_REPO}-{size}"


def demo_gguf_path(cache_dir: Path, quant: str, size: str = "tiny") -> Path:
    """Where the demo GGUF of `quant` lives (built or not)."""
    return demo_gguf_dir(cache_dir, size) / f"{DEMO_MODEL_NAME}-{size}-{quant}.gguf"


def ensure_demo_gguf(cache_dir: Path, quant: str, size: str = "tiny") -> Path:
    """The demo GGUF of `quant`, building every quantization (and the checkpoint they are
    converted from) on first use."""
    if quant not in QUANTS:
        raise ValueError(f"unknown demo GGUF quantization {quant!r}; choose from {list(QUANTS)}")
    if SIZES[size]["dtype"] != "float32":  # numpy has no bfloat16
        raise ValueError(f"the {size} demo model is stored in {SIZES[size]['dtype']}; GGUF conversion reads float32")
    marker = {"generator_version": GENERATOR_VERSION, "converter_version": CONVERTER_VERSION, "size": size}
    ensure_built(
        demo_gguf_dir(cache_dir, size),
        marker,
        lambda out: write_all(ensure_demo_model(Path(cache_dir), size), out, size),
    )
    return demo_gguf_path(cache_dir, quant, size)


def write_all(checkpoint: Path, out_dir: Path, size: str) -> None:
    """Every quantization of the demo GGUF of `size` into `out_dir`."""
    for quant in QUANTS:
        write_gguf(checkpoint, out_dir / demo_gguf_path(out_dir.parent, quant, size).name, quant)


def write_gguf(checkpoint: Path, out: Path, quant: str) -> Path:
    """Convert a float32 Llama checkpoint directory (the demo's) to one GGUF file."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    gen = json.loads((checkpoint / "generation_config.json").read_text())
    tok = json.loads((checkpoint / "tokenizer.json").read_text())
    tok_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    weights = load_file(checkpoint / "model.safetensors")

    qtype = {
        "F16": gguf.GGMLQuantizationType.F16,
        "Q8_0": gguf.GGMLQuantizationType.Q8_0,
        "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    }[quant]
    ftype = {
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    }[quant]
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    hidden = config["hidden_size"]

    w = gguf.GGUFWriter(out, "llama")
    w.add_name(checkpoint.name)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hidden // n_head)
    w.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_vocab_size(config["vocab_size"])
    w.add_file_type(int(ftype))

    # byte-level BPE: llama.cpp's "gpt2" model with GPT-2's pre-tokenizer regex, as trained
    vocab = tok["model"]["vocab"]
    added = {t["content"]: t for t in tok["added_tokens"]}
    tokens = [None] * config["vocab_size"]
    for text, i in {**vocab, **{t: a["id"] for t, a in added.items()}}.items():
        tokens[i] = text
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for text, a in added.items():
        # markup the tool-call parsers read stays text (USER_DEFINED), the rest is control
        types[a["id"]] = gguf.TokenType.USER_DEFINED if text in TOOL_CALL_TAGS else gguf.TokenType.CONTROL
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(config["bos_token_id"])
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    w.add_eos_token_id(config["eos_token_id"])
    for extra in eos:  # the end-of-turn token (<|im_end|>) ends generation as EOS does
        if extra != config["eos_token_id"]:
            w.add_eot_token_id(extra)
    w.add_pad_token_id(config["pad_token_id"])
    w.add_add_bos_token(bool(tok_config.get("add_bos_token", True)))
    w.add_chat_template((checkpoint / "chat_template.jinja").read_text())

    def tensor(name: str, data) -> None:
        data = np.ascontiguousarray(data, dtype=np.float32)
        if data.ndim == 1:  # norms stay float32, as llama.cpp's converter keeps them
            w.add_tensor(name, data)
            return
        kind = qtype
        if qtype != gguf.GGMLQuantizationType.F16 and data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
            kind = gguf.GGMLQuantizationType.F16  # rows not a whole number of blocks (llama.cpp falls back too)
        w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    def rope_order(data, heads: int):
        # HF rotates halves of each head; llama.cpp's "llama" rope rotates adjacent pairs
        return data.reshape(heads, 2, data.shape[0] // heads // 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)

    tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensor(f"blk.{i}.attn_norm.weight", weights[p + "input_layernorm.weight"])
        tensor(f"blk.{i}.attn_q.weight", rope_order(weights[p + "self_attn.q_proj.weight"], n_head))
        tensor(f"blk.{i}.attn_k.weight", rope_order(weights[p + "self_attn.k_proj.weight"], n_kv))
        tensor(f"blk.{i}.attn_v.weight", weights[p + "self_attn.v_proj.weight"])
        tensor(f"blk.{i}.attn_output.weight", weights[p + "self_attn.o_proj.weight"])
        tensor(f"blk.{i}.ffn_norm.weight", weights[p + "post_attention_layernorm.weight"])
        tensor(f"blk.{i}.ffn_gate.weight", weights[p + "mlp.gate_proj.weight"])
        tensor(f"blk.{i}.ffn_up.weight", weights[p + "mlp.up_proj.weight"])
        tensor(f"blk.{i}.ffn_down.weight", weights[p + "mlp.down_proj.weight"])
    tensor("output_norm.weight", weights["model.norm.weight"])
    tensor("output.weight", weights["lm_head.weight"])

    return write_file(w, out)
