"""A BERT checkpoint written as llama.cpp's `bert` GGUF (engines/llama_cpp/bert_gguf.py): the
tensor-name map, the WordPiece vocabulary as llama.cpp's WPM reads it, the special ids, and a
tiny random checkpoint written and read back; the embedding packing and the rule that names an
embedding model (gguf_meta)."""

import json

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from greenroom.engines.llama_cpp import gguf_meta
from greenroom.engines.llama_cpp.bert_gguf import (
    NORMALIZE_KEY,
    special_ids,
    tensor_name,
    wordpiece_vocab,
    write_bert_gguf,
)
from greenroom.engines.llama_cpp.llama_cpp_engine import _packed

ST = "sentence_transformers.models."


@pytest.mark.parametrize(
    "name,expected",
    [
        ("embeddings.word_embeddings.weight", "token_embd.weight"),
        ("embeddings.token_type_embeddings.weight", "token_types.weight"),
        ("embeddings.position_embeddings.weight", "position_embd.weight"),
        ("embeddings.LayerNorm.bias", "token_embd_norm.bias"),
        ("bert.embeddings.LayerNorm.weight", "token_embd_norm.weight"),  # BertForMaskedLM's prefix
        ("encoder.layer.0.attention.self.query.weight", "blk.0.attn_q.weight"),
        ("encoder.layer.3.attention.self.key.bias", "blk.3.attn_k.bias"),
        ("encoder.layer.11.attention.self.value.weight", "blk.11.attn_v.weight"),
        ("encoder.layer.1.attention.output.dense.weight", "blk.1.attn_output.weight"),
        ("encoder.layer.1.attention.output.LayerNorm.bias", "blk.1.attn_output_norm.bias"),
        ("encoder.layer.2.intermediate.dense.weight", "blk.2.ffn_up.weight"),
        ("encoder.layer.2.output.dense.bias", "blk.2.ffn_down.bias"),
        ("encoder.layer.5.output.LayerNorm.weight", "blk.5.layer_output_norm.weight"),
        ("embeddings.position_ids", None),
        ("pooler.dense.weight", None),
    ],
)
def test_tensor_names_are_llama_cpps(name, expected):
    assert tensor_name(name) == expected


@pytest.mark.parametrize("name", ["cls.predictions.bias", "encoder.layer.0.attention.self.rotary.weight", "lm_head"])
def test_a_tensor_bert_has_no_place_for_is_refused(name):
    with pytest.raises(ValueError, match="no place"):
        tensor_name(name)


TOKENIZER = {
    "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
    "model": {
        "type": "WordPiece",
        "continuing_subword_prefix": "##",
        "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "##lo": 5, "play": 6, "##ing": 7},
    },
    "added_tokens": [
        {"id": 0, "content": "[PAD]", "special": True},
        {"id": 1, "content": "[UNK]", "special": True},
        {"id": 2, "content": "[CLS]", "special": True},
        {"id": 3, "content": "[SEP]", "special": True},
        {"id": 9, "content": "<note>", "special": False},
    ],
}
CONFIG = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def test_wordpiece_vocab_is_the_phantom_space_form():
    tokens, types = wordpiece_vocab(TOKENIZER)
    # a word-initial piece carries "▁" (llama.cpp prefixes each word with it), a "##" piece loses
    # its prefix, special tokens stay as written; id 8, which nothing names, is a placeholder
    assert tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "lo", "▁play", "ing", "[PAD8]", "<note>"]
    T = gguf.TokenType
    assert types == [T.CONTROL] * 4 + [T.NORMAL] * 4 + [T.UNUSED, T.USER_DEFINED]


def test_a_tokenizer_that_is_not_wordpiece_is_refused():
    with pytest.raises(ValueError, match="not WordPiece"):
        wordpiece_vocab({"model": {"type": "BPE", "vocab": {}}})


def test_special_ids_by_the_names_the_config_gives():
    assert special_ids(TOKENIZER, CONFIG) == {"cls": 2, "sep": 3, "unk": 1, "pad": 0}  # no [MASK] in this vocabulary


def _checkpoint(tmp_path, pooling=None, normalize=True, arch="BertModel"):
    """A 2-layer BERT of width 8 with random weights, and its sentence-transformers modules."""
    rng = np.random.default_rng(0)
    config = {
        "architectures": [arch],
        "model_type": "bert",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "vocab_size": 10,
    }
    shapes = {
        "embeddings.word_embeddings.weight": (10, 8),
        "embeddings.token_type_embeddings.weight": (2, 8),
        "embeddings.position_embeddings.weight": (32, 8),
        "embeddings.LayerNorm.weight": (8,),
        "embeddings.LayerNorm.bias": (8,),
        "pooler.dense.weight": (8, 8),
    }
    for i in range(2):
        for part, shape in {
            "attention.self.query": (8, 8),
            "attention.self.key": (8, 8),
            "attention.self.value": (8, 8),
            "attention.output.dense": (8, 8),
            "attention.output.LayerNorm": None,
            "intermediate.dense": (16, 8),
            "output.dense": (8, 16),
            "output.LayerNorm": None,
        }.items():
            rows = (shape or (8,))[0]
            shapes[f"encoder.layer.{i}.{part}.weight"] = shape or (8,)
            shapes[f"encoder.layer.{i}.{part}.bias"] = (rows,)
    save_file({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(CONFIG))
    modules = [
        {"idx": 0, "path": "", "type": ST + "Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": ST + "Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "path": "2_Normalize", "type": ST + "Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling or {"pooling_mode_mean_tokens": True}))
    return tmp_path, shapes


@pytest.mark.parametrize("pooling,normalize,code", [(None, True, 1), ({"pooling_mode_cls_token": True}, False, 2)])
def test_a_checkpoint_is_written_as_llama_cpp_reads_it(tmp_path, pooling, normalize, code):
    (tmp_path / "ckpt").mkdir()
    checkpoint, shapes = _checkpoint(tmp_path / "ckpt", pooling, normalize)
    out = write_bert_gguf(checkpoint, tmp_path / "model.gguf")
    meta = gguf_meta.read(out)
    assert meta.get("general.architecture") == "bert" and meta.get("bert.attention.causal") is False
    assert meta.get("bert.pooling_type") == code and meta.get(NORMALIZE_KEY) is normalize
    assert meta.get("bert.context_length") == 32 and meta.get("bert.embedding_length") == 8
    assert meta.get("tokenizer.ggml.model") == "bert" and meta.get("tokenizer.ggml.bos_token_id") == 2
    assert meta.get("tokenizer.ggml.seperator_token_id") == 3 and meta.get("tokenizer.ggml.add_sep_token") is True
    assert gguf_meta.embedding_only(meta)
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert set(tensors) == {tensor_name(n) for n in shapes} - {None}  # the pooler left out
    kinds = {name: t.tensor_type for name, t in tensors.items()}
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert kinds["blk.1.ffn_up.weight"] == kinds["token_embd.weight"] == F16
    assert kinds["token_types.weight"] == kinds["blk.0.attn_q.bias"] == kinds["token_embd_norm.weight"] == F32


@pytest.mark.parametrize(
    "pooling,arch,message",
    [
        ({"pooling_mode_max_tokens": True}, "BertModel", "no pooling type"),
        (None, "LlamaForCausalLM", "only BertModel"),
    ],
)
def test_what_llama_cpp_would_not_run_alike_is_refused(tmp_path, pooling, arch, message):
    checkpoint, _ = _checkpoint(tmp_path, pooling, arch=arch)
    with pytest.raises(ValueError, match=message):
        write_bert_gguf(checkpoint, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_an_embedding_model_is_one_whose_header_names_a_pooling_type():
    # Ollama's rule: llama.cpp's metadata dict (strings) and the header reader's alike
    assert gguf_meta.embedding_only({"general.architecture": "bert", "bert.pooling_type": "1"})
    assert not gguf_meta.embedding_only({"general.architecture": "llama", "llama.context_length": "8192"})


def test_embedding_inputs_are_packed_in_order_within_both_limits():
    assert _packed([40] * 5, 100, 64) == [[0, 1], [2, 3], [4]]
    assert _packed([3] * 5, 512, 2) == [[0, 1], [2, 3], [4]]
    assert _packed([10, 600, 10, 10], 512, 64) == [[0], [1], [2, 3]]  # a long input is decoded alone
    assert _packed([], 512, 64) == []


def test_embedding_decodes_are_larger_on_more_threads():
    # one thread: less attention across a decode's inputs; two: fewer meetings of the threads
    assert gguf_meta.embed_tokens(1) == 256 and gguf_meta.embed_tokens(2) == gguf_meta.embed_tokens(4) == 512
    assert gguf_meta.embedding_ubatch(128) == 512 and gguf_meta.embedding_ubatch(2048) == 2048  # holds either
