"""The demo model as OpenVINO IR, for the OpenVINO GenAI engine: the same weights and
tokenizer as the Hugging Face demo checkpoint (demo_model.py), written as a graph with
openvino's own op API — no optimum-intel (it would pin transformers below 5.6 and pull a
torchvision that breaks the CPU torch wheel). Deterministic, about two seconds.

The LLM graph is laid out as optimum-intel's stateful exports are (inputs `input_ids`,
`attention_mask`, `position_ids`, `beam_idx`; output `logits`; the KV cache in variables
made by openvino's MakeStateful from `past_key_values.N.key` → `present.N.key` pairs), so
`LLMPipeline` loads it on the CPU and through the NPU pipeline, whose static-shape rewrite
(StatefulToStateless) reads those names back. The llama.cpp-derived graph `LLMPipeline`
builds from a GGUF file does not survive that rewrite (its grouped-query broadcast fails on
the empty prefill cache), hence this builder. A second, stateless graph ending at the final
norm (`last_hidden_state`) lies in `embedding/` for `TextEmbeddingPipeline`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..built_dirs import ensure_built
from .demo_model import DEMO_MODEL_NAME, ensure_demo_model

# bump when the export writes different files (the checkpoint's own version is in the marker too)
CONVERTER_VERSION = 1
# where a model directory keeps the feature-extraction graph TextEmbeddingPipeline loads
EMBEDDING_SUBDIR = "embedding"


def demo_openvino_dir(cache_dir: Path, size: str = "tiny") -> Path:
    """Where the demo IR of `size` lives (built or not)."""
    return Path(cache_dir) / f"{DEMO_MODEL_NAME}-openvino-{size}"


def ensure_demo_openvino(cache_dir: Path, size: str = "tiny") -> Path:
    """The demo model's OpenVINO directory, exporting it (and building the checkpoint it is
    exported from) on first use."""
    checkpoint = ensure_demo_model(Path(cache_dir), size)
    marker = {**json.loads((checkpoint / "greenroom.json").read_text()), "converter_version": CONVERTER_VERSION}
    return ensure_built(demo_openvino_dir(cache_dir, size), marker, lambda out: export_llama(checkpoint, out))


def export_llama(checkpoint: Path, out: Path) -> Path:
    """Export a Llama checkpoint directory (the demo's, or any LlamaForCausalLM in safetensors)
    to an OpenVINO model directory: the stateful LLM, its tokenizer and detokenizer, the HF
    configs LLMPipeline reads, and the embedding graph with its tokenizer in `embedding/`."""
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]:
        raise ValueError(
            f"{checkpoint} is {config.get('architectures')}, not LlamaForCausalLM: "
            "export it with optimum-cli (greenroom convert uses it when it is installed)"
        )
    weights = _float32_weights(checkpoint)
    if config.get("tie_word_embeddings") and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    tokenizer, detokenizer = convert_tokenizer(AutoTokenizer.from_pretrained(checkpoint), with_detokenizer=True)
    embedding = out / EMBEDDING_SUBDIR
    embedding.mkdir(parents=True)
    for directory, model in [
        (out, llama_graph(config, weights, kv_cache=True)),
        (embedding, llama_graph(config, weights, kv_cache=False)),
    ]:
        # float32 kept as is: the IR computes what the checkpoint does (save_model would halve it)
        ov.save_model(model, directory / "openvino_model.xml", compress_to_fp16=False)
        ov.save_model(tokenizer, directory / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, out / "openvino_detokenizer.xml")
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ):
        shutil.copyfile(checkpoint / name, out / name)
    for path in out.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return out


def _float32_weights(checkpoint: Path) -> dict:
    """Every tensor of the checkpoint's safetensors shards as float32 numpy (the graph is
    built in float32; bfloat16, which numpy lacks, is widened through torch)."""
    from safetensors import safe_open

    weights = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).float().numpy()
    if not weights:
        raise ValueError(f"{checkpoint} has no .safetensors weights")
    return weights


def llama_graph(config: dict, weights: dict, kv_cache: bool):
    """The Llama forward pass of transformers' LlamaForCausalLM as an OpenVINO model.

    kv_cache=True: the stateful LLM (→ `logits` [B, T, vocab]); False: the stateless encoder
    (→ `last_hidden_state` [B, T, hidden], after the final norm, as the transformers engine
    embeds)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as op
    from openvino._offline_transformations import apply_make_stateful_transformation

    hidden, n_layers = config["hidden_size"], config["num_hidden_layers"]
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // n_head
    theta = float((config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0)))
    eps = np.float32(config["rms_norm_eps"])

    def named(node, name: str):
        node.set_friendly_name(name)
        node.output(0).get_tensor().set_names({name})
        return node

    def parameter(name: str, shape: list[int], dtype=np.int64):
        return named(op.parameter(shape, dtype), name)

    def f32(value):
        return op.constant(np.asarray(value, dtype=np.float32))

    def i64(value):
        return op.constant(np.asarray(value, dtype=np.int64))

    def linear(x, name: str):
        return op.matmul(x, f32(weights[name]), False, True)

    def rms_norm(x, name: str):
        variance = op.reduce_mean(op.multiply(x, x), i64([-1]), True)
        return op.multiply(op.divide(x, op.sqrt(op.add(variance, f32(eps)))), f32(weights[name]))

    def heads(x, n: int):  # [B, T, n·d] → [B, n, T, d]
        return op.transpose(op.reshape(x, i64([0, 0, n, head_dim]), True), i64([0, 2, 1, 3]))

    input_ids = parameter("input_ids", [-1, -1])
    attention_mask = parameter("attention_mask", [-1, -1])
    inputs = [input_ids, attention_mask]
    if kv_cache:
        position_ids = parameter("position_ids", [-1, -1])
        beam_idx = parameter("beam_idx", [-1], np.int32)
        inputs += [position_ids, beam_idx]
        positions = op.convert(position_ids, np.float32)
    else:  # one sequence per row, from position 0
        positions = op.convert(op.subtract(op.cumsum(attention_mask, i64(1)), i64(1)), np.float32)

    # rotary embedding as transformers computes it: halves rotated, frequencies in float32
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    freqs = op.multiply(op.unsqueeze(positions, i64(-1)), f32(inv_freq.astype(np.float32)))
    angles = op.unsqueeze(op.concat([freqs, freqs], -1), i64(1))  # [B, 1, T, d]
    cos, sin = op.cos(angles), op.sin(angles)

    def rope(x):
        first, second = op.split(x, i64(-1), 2).outputs()
        return op.add(op.multiply(x, cos), op.multiply(op.concat([op.negative(second), first], -1), sin))

    # additive mask [B, 1, T, S]: key j is visible to query i when it is not padding and
    # j ≤ past + i, past = S − T (the cache's length, whatever static size the NPU gives it)
    q_len = op.gather(op.shape_of(input_ids), i64(1), i64(0))
    kv_len = op.gather(op.shape_of(attention_mask), i64(1), i64(0))
    query_at = op.range(op.subtract(kv_len, q_len), kv_len, i64(1), "i64")
    key_at = op.range(i64(0), kv_len, i64(1), "i64")
    causal = op.less_equal(op.unsqueeze(key_at, i64(0)), op.unsqueeze(query_at, i64(1)))
    visible = op.logical_and(
        op.unsqueeze(causal, i64([0, 1])), op.unsqueeze(op.greater(attention_mask, i64(0)), i64([1, 2]))
    )
    # float16's lowest, not float32's: with float32's the NPU pipeline answered token 0 forever
    mask = op.select(visible, f32(0.0), f32(-65504.0))

    x = op.gather(f32(weights["model.embed_tokens.weight"]), input_ids, i64(0))
    results, state_pairs = [], {}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, p + "input_layernorm.weight")
        q = rope(heads(linear(h, p + "self_attn.q_proj.weight"), n_head))
        k = rope(heads(linear(h, p + "self_attn.k_proj.weight"), n_kv))
        v = heads(linear(h, p + "self_attn.v_proj.weight"), n_kv)
        if kv_cache:
            caches = []
            for kind, new in (("key", k), ("value", v)):
                past = parameter(f"past_key_values.{i}.{kind}", [-1, n_kv, -1, head_dim], np.float32)
                inputs.append(past)
                # beam_idx reorders the cache rows, as optimum-intel's exports do
                present = named(op.concat([op.gather(past, beam_idx, i64(0)), new], 2), f"present.{i}.{kind}")
                results.append(op.result(present))
                state_pairs[f"past_key_values.{i}.{kind}"] = f"present.{i}.{kind}"
                caches.append(present)
            k, v = caches
        if n_head != n_kv:  # grouped-query attention: each KV head serves n_head / n_kv query heads
            repeat = [1, 1, n_head // n_kv, 1, 1]
            k, v = (
                op.reshape(op.tile(op.unsqueeze(t, i64(2)), i64(repeat)), i64([0, n_head, -1, head_dim]), True)
                for t in (k, v)
            )
        attn = op.scaled_dot_product_attention(q, k, v, mask, f32(head_dim**-0.5), causal=False)
        attn = op.reshape(op.transpose(attn, i64([0, 2, 1, 3])), i64([0, 0, n_head * head_dim]), True)
        x = op.add(x, linear(attn, p + "self_attn.o_proj.weight"))
        h = rms_norm(x, p + "post_attention_layernorm.weight")
        gated = op.multiply(op.swish(linear(h, p + "mlp.gate_proj.weight")), linear(h, p + "mlp.up_proj.weight"))
        x = op.add(x, linear(gated, p + "mlp.down_proj.weight"))
    x = rms_norm(x, "model.norm.weight")
    if not kv_cache:
        return _stable_names(ov.Model([op.result(named(x, "last_hidden_state"))], inputs, "greenroom-demo-embedding"))
    logits = named(linear(x, "lm_head.weight"), "logits")
    model = ov.Model([op.result(logits), *results], inputs, "greenroom-demo")
    apply_make_stateful_transformation(model, state_pairs)
    return _stable_names(model)


def _stable_names(model):
    """Unnamed nodes get names from a process-wide counter; number them in graph order
    instead, so that the same checkpoint always exports to the same bytes."""
    for i, node in enumerate(model.get_ordered_ops()):
        given = node.output(0).get_names() if node.get_output_size() else set()
        if node.get_friendly_name() not in given:
            node.set_friendly_name(f"{node.get_type_name()}_{i}")
    return model
