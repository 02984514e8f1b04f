"""What a model takes loaded, counted before it loads: a GGUF's KV cache per token from its
header (engines/llama_cpp/gguf_meta.py) and the pre-load estimate of supervisor/memory.py
(tests/live/test_gguf_footprint.py: the estimate against what the engine reports on SmolLM2 and
Gemma 3, and where /api/ps and `greenroom ps` show it)."""

from __future__ import annotations

import gguf
import numpy as np

from greenroom.engines.llama_cpp import gguf_meta
from greenroom.supervisor.memory import checkpoint_bytes
from greenroom.supervisor.placements import Placement

# SmolLM2-135M's shape (llama: 30 blocks, 9 heads of 64, 3 KV heads, 8k window, 49,152 tokens)
SMOL = {"block_count": 30, "embedding_length": 576, "attention.head_count": 9, "attention.head_count_kv": 3}
# Gemma 3 270M's (its heads are wider than embedding_length / head_count: 256, not 160)
GEMMA = {
    "block_count": 18,
    "embedding_length": 640,
    "attention.head_count": 4,
    "attention.head_count_kv": 1,
    "attention.key_length": 256,
    "attention.value_length": 256,
}


def write(path, arch: str, keys: dict, context: int = 8192, vocab: int = 2000):
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.context_length", context)
    for key, value in keys.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", value)
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_kv_bytes_per_token_from_the_header(tmp_path):
    # each layer's K and V rows, f16: layers × KV heads × (key + value width) × 2 bytes
    smol = gguf_meta.read(write(tmp_path / "smol.gguf", "llama", SMOL))
    assert gguf_meta.kv_bytes_per_token(smol) == 30 * 3 * (64 + 64) * 2 == 23_040  # llama.cpp: 360 MiB at 16,384 cells
    gemma = gguf_meta.read(write(tmp_path / "gemma.gguf", "gemma3", GEMMA))
    assert gguf_meta.kv_bytes_per_token(gemma) == 18 * 1 * (256 + 256) * 2 == 18_432  # llama.cpp: 48 + 240 MiB
    # no KV head count: as many as the query heads
    mha = gguf_meta.read(write(tmp_path / "mha.gguf", "llama", {**SMOL, "attention.head_count_kv": 9}))
    no_kv = {k: v for k, v in SMOL.items() if k != "attention.head_count_kv"}
    assert gguf_meta.kv_bytes_per_token(gguf_meta.read(write(tmp_path / "nokv.gguf", "llama", no_kv))) == (
        gguf_meta.kv_bytes_per_token(mha)
    )


def test_a_kv_head_count_per_layer_counts_each_layer(tmp_path):
    # a hybrid's recurrent layers hold no KV (0), OpenELM-style ones differ per layer
    per_layer = {**SMOL, "block_count": 4, "attention.head_count_kv": [0, 2, 3, 0]}
    meta = gguf_meta.read(write(tmp_path / "hybrid.gguf", "llama", per_layer))
    assert gguf_meta.kv_bytes_per_token(meta) == (2 + 3) * (64 + 64) * 2


def test_a_header_without_the_shape_has_no_figure(tmp_path):
    meta = gguf_meta.read(write(tmp_path / "bare.gguf", "llama", {"block_count": 30}))
    assert gguf_meta.kv_bytes_per_token(meta) is None
    assert gguf_meta.load_bytes(meta, 1234, 4096, 4) == 1234  # the file alone


def test_the_estimate_is_the_file_and_its_context(tmp_path):
    path = write(tmp_path / "smol.gguf", "llama", SMOL, context=8192, vocab=2000)
    size = path.stat().st_size

    def estimate(n_ctx, parallel):
        return checkpoint_bytes(Placement("m", str(path), "llama.cpp", "cpu", n_ctx=n_ctx, parallel=parallel))

    def expected(cells):  # the KV cells, and a ubatch of up to 512 tokens' float32 logits
        return size + cells * 23_040 + min(cells, 512) * 2000 * 4

    assert estimate(4096, 4) == expected(16_384)
    assert estimate(0, 4) == estimate(None, 4) == expected(32_768)  # 0 / None: the trained window
    assert estimate(100_000, 1) == expected(8192)  # capped at the trained window, as the engine caps it
    assert estimate(128, None) == expected(128)  # no parallel: one sequence
    # the engine's own window is the same function's
    assert gguf_meta.window(100_000, 8192) == 8192 and gguf_meta.window(0, 0) == 4096


def test_a_file_that_is_not_gguf_is_estimated_at_its_size(tmp_path):
    blob = tmp_path / "sha256-0123"  # an uploaded blob has no suffix
    blob.write_bytes(b"not a gguf file at all")
    assert checkpoint_bytes(Placement("m", str(blob), "llama.cpp", "cpu", n_ctx=4096, parallel=4)) == 22
    assert checkpoint_bytes(Placement("m", str(tmp_path / "absent.gguf"), "llama.cpp", "cpu")) is None
