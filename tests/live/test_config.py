"""The configuration as `greenroom serve` reads it: a bad file stops the start with one line; a
file below model_dirs is configured by an entry that names it and served once
(tests/unit/test_config.py: the loader itself)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
from conftest import ROOT

from greenroom.config import load_config


def test_a_bad_config_stops_serve_with_one_line(tmp_path):
    for text, said in (
        ("port = 'x'\n", "invalid value for type, expected int @ config.port"),
        ("prot = 1\n", "extra fields found (prot)"),
        ("port = \n", "is not valid TOML"),
        ('[[models]]\nid = "found:Q4_0"\n', "model 'found:Q4_0' has no source"),
    ):
        (tmp_path / "mine.toml").write_text(text)
        done = subprocess.run(
            [sys.executable, "-m", "greenroom", "serve", "--config", str(tmp_path / "mine.toml")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_file_below_model_dirs_is_configured_by_its_entry_and_served_once(own_server, model_cache, tmp_path):
    demo = model_cache / "models" / "greenroom-demo-gguf-tiny" / "greenroom-demo-tiny-Q4_0.gguf"
    for folder in ("found", "sourced"):
        (tmp_path / "models" / folder).mkdir(parents=True)
        shutil.copy(demo, tmp_path / "models" / folder / "model.gguf")
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
    srv = own_server(
        f"""
defaults = true  # over configs/default.toml, as a user's file is
model_dirs = ["{tmp_path / "models"}"]

[[models]]
id = "found:Q4_0"           # the file found below model_dirs, with a template of its own
chat_template = {json.dumps(template)}

[[models]]
id = "mine"
source = "{tmp_path / "models" / "sourced" / "model.gguf"}"
engine = "llama.cpp"
"""
    )
    served = [m["id"] for m in httpx.get(srv.url + "/v1/models", timeout=10).json()["data"]]
    defaults = [m.id for m in load_config().models]
    assert sorted(served) == sorted(defaults + ["found:Q4_0", "mine"])  # "sourced:Q4_0" is "mine"
    show = httpx.post(srv.url + "/api/show", json={"model": "found:Q4_0"}, timeout=30).json()
    assert show["template"] == template
    r = httpx.post(srv.url + "/tokenize", json={"model": "found:Q4_0", "messages": [{"role": "user", "content": "hi"}]})
    said = httpx.post(srv.url + "/detokenize", json={"model": "found:Q4_0", "tokens": r.json()["tokens"]}, timeout=30)
    assert said.json()["prompt"].endswith("[user] hi\n[assistant] "), said.text
