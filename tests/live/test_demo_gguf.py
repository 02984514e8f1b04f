"""The demo model as GGUF: deterministic files whose F16 conversion answers exactly as
the Hugging Face checkpoint does (same tokens, same greedy text) — the converter's check."""

from __future__ import annotations

import hashlib

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_gguf import QUANTS, ensure_demo_gguf, write_all
from greenroom.engines.demo.demo_model import default_cache_dir, demo_model_dir
from greenroom.engines.generation import generate
from greenroom.engines.llama_cpp.gguf_files import discover, quant_label
from greenroom.engines.loader import load_engine


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_quantization_is_built_deterministically(model_cache, tmp_path):
    cache = default_cache_dir(model_cache)
    files = {q: ensure_demo_gguf(cache, q) for q in QUANTS}
    assert {q: quant_label(p) for q, p in files.items()} == {q: q for q in QUANTS}
    (tmp_path / "again").mkdir()
    write_all(demo_model_dir(cache, "tiny"), tmp_path / "again", "tiny")
    assert all(digest(p) == digest(tmp_path / "again" / p.name) for p in files.values())
    assert [name for name, _ in discover([tmp_path])] == [f"again:{q}" for q in sorted(QUANTS)]


def test_f16_answers_as_the_checkpoint_does(model_cache):
    spec = {"id": "m", "cache_dir": str(model_cache)}
    hf = load_engine({**spec, "source": "demo:tiny", "engine": "transformers"})
    gg = load_engine({**spec, "source": "demo-gguf:F16", "engine": "llama.cpp"})
    text = "Hello wörld, <tool_call> 12345 café\n  x"
    assert hf.tokenize(text) == gg.tokenize(text)
    msgs = [{"role": "user", "content": "Tell me about the sea."}]
    ids = hf.render_chat(msgs)
    assert gg.render_chat(msgs) == ids
    greedy = SamplingParams(max_tokens=40, temperature=0)
    assert "".join(d.text for d in generate(hf, ids, greedy)) == "".join(d.text for d in generate(gg, ids, greedy))
    gg.unload()
