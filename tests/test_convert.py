"""`greenroom convert`: a Hugging Face checkpoint → an OpenVINO model directory the openvino
engine serves (greenroom's own Llama exporter here: optimum-cli is not installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo_model import default_cache_dir, demo_model_dir
from greenroom.engines.generation import generate
from greenroom.engines.loader import load_engine


def convert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "greenroom", "convert", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_a_llama_checkpoint_converts_and_answers_as_the_demo_ir(model_cache, tmp_path):
    checkpoint = demo_model_dir(default_cache_dir(model_cache), "tiny")
    done = convert(checkpoint, tmp_path / "ov")
    assert done.returncode == 0, done.stderr
    greedy = SamplingParams(max_tokens=24, temperature=0)
    texts = []
    for source in (str(tmp_path / "ov"), "demo-openvino:tiny"):
        engine = load_engine({"id": "m", "source": source, "engine": "openvino", "device": "cpu",
                              "dtype": "float32", "cache_dir": str(model_cache)})
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
