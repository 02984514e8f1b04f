"""`greenroom convert`: a Hugging Face checkpoint → an OpenVINO model directory the openvino
engine serves (greenroom's own Llama exporter here: optimum-cli is not installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, demo_model_dir
from greenroom.engines.generation import generate
from greenroom.engines.loader import load_engine


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "greenroom", "convert", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_a_llama_checkpoint_converts_and_answers_as_the_demo_ir(model_cache, tmp_path):
    checkpoint = demo_model_dir(default_cache_dir(model_cache), "tiny")
    done = convert(checkpoint, tmp_path / "ov")
    assert done.returncode == 0, done.stderr
    greedy = SamplingParams(max_tokens=24, temperature=0)
    texts = []
    for source in (str(tmp_path / "ov"), "demo-openvino:tiny"):
        engine = load_engine(
            {
                "id": "m",
                "source": source,
                "engine": "openvino",
                "device": "cpu",
                "dtype": "float32",
                "cache_dir": str(model_cache),
            }
        )
        ids = engine.render_chat([{"role": "user", "content": "Tell me about the sea."}])
        texts.append("".join(d.text for d in generate(engine, ids, greedy)))
        engine.unload()
    assert texts[0] and texts[0] == texts[1]


def test_other_architectures_are_refused_clearly(model_cache, tmp_path):
    checkpoint = tmp_path / "gpt2"
    shutil.copytree(demo_model_dir(default_cache_dir(model_cache), "tiny"), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    done = convert(checkpoint, tmp_path / "out")
    assert done.returncode == 2 and "optimum-cli" in done.stderr and "GPT2LMHeadModel" in done.stderr
    assert convert(checkpoint, checkpoint).returncode == 2  # an existing, non-empty directory is not overwritten


def test_a_gguf_file_converts_back_to_the_checkpoint_it_was_made_from(model_cache, tmp_path):
    """The demo GGUF's F16 file, dequantised by `convert --from-gguf`, tokenises, renders chats,
    ends answers and answers greedy as the demo checkpoint it was written from."""
    gguf_file = default_cache_dir(model_cache) / "greenroom-demo-gguf-tiny" / "greenroom-demo-tiny-F16.gguf"
    done = convert("--from-gguf", gguf_file, tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    greedy = SamplingParams(max_tokens=32, temperature=0)
    chat = [{"role": "user", "content": "Tell me about the sea in 2024."}]
    seen = []
    for source in (str(tmp_path / "hf"), "demo:tiny"):
        engine = load_engine({"id": "m", "source": source, "engine": "transformers", "cache_dir": str(model_cache)})
        ids = engine.render_chat(chat)
        seen.append(
            (
                ids,
                engine.tokenize("x  2, <tool_call> 3.5"),
                engine.eos_token_ids,
                "".join(d.text for d in generate(engine, ids, greedy)),
            )
        )
        engine.unload()
    assert seen[0] == seen[1] and seen[0][3]


def test_a_file_that_is_not_gguf_is_refused_and_leaves_nothing(tmp_path):
    (tmp_path / "model.gguf").write_text("not a GGUF file")
    done = convert("--from-gguf", tmp_path / "model.gguf", tmp_path / "out")
    assert done.returncode == 2 and "GGUF" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    assert convert("--from-gguf", tmp_path / "model.gguf", tmp_path, tmp_path / "out").returncode == 2
