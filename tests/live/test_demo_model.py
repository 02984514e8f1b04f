"""The locally generated demo checkpoint loads and behaves like a real one."""

import json
import stat
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from greenroom.engines.demo.demo_model import (
    DEMO_MODEL_NAME,
    GENERATOR_VERSION,
    SIZES,
    build_demo_model,
    default_cache_dir,
    ensure_demo_model,
)

EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "greenroom.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / DEMO_MODEL_NAME)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def test_build_is_byte_for_byte_deterministic(tmp_path):
    a = build_demo_model(tmp_path / "a", seed=3)
    b = build_demo_model(tmp_path / "b", seed=3)
    names = {p.name for p in a.iterdir()}
    assert names == EXPECTED_FILES == {p.name for p in b.iterdir()}
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
        assert stat.S_IMODE((a / name).stat().st_mode) == 0o644, name
    assert stat.S_IMODE(a.stat().st_mode) == 0o755
    marker = json.loads((a / "greenroom.json").read_text())
    assert marker == {"generator_version": GENERATOR_VERSION, "size": "tiny", "seed": 3}
    # Only the two finished models: no temp or stale directories left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_seed_changes_weights_not_tokenizer(tmp_path, model_dir):
    other = build_demo_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_rebuild_replaces_existing_directory(tmp_path):
    out = build_demo_model(tmp_path / "m", seed=1)
    (out / "leftover.txt").write_text("from an older build")
    build_demo_model(out, seed=2)
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES
    assert json.loads((out / "greenroom.json").read_text())["seed"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_loads_as_llama(model, tokenizer):
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer) == SIZES["tiny"]["vocab_size"]
    assert model.dtype == torch.float32
    assert 0.9e6 < model.num_parameters() < 3e6
    ends = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|end_of_text|>"])
    assert sorted(model.generation_config.eos_token_id) == sorted(ends)
    assert tokenizer.bos_token == "<|begin_of_text|>"
    assert tokenizer.eos_token == tokenizer.pad_token == "<|end_of_text|>"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "héllo — 你好 🙂",
        "  two leading spaces,\ttabs and\r\nCRLF\n\n",
        'def f(x):\n    return {"x": x ** 2}  # 3.14159',
        "",
    ],
)
def test_text_round_trips(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_markup_tokens_are_atomic(tokenizer):
    for tag in ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]:
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    # Tool-call tags survive skipping specials, so a parser can still find them.
    ids = tokenizer('<|im_start|><tool_call>{"a": 1}</tool_call><|im_end|>')["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == '<tool_call>{"a": 1}</tool_call>'


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 4}'},
    {"role": "function", "name": "get_weather", "content": None},
    {"role": "assistant", "content": "4 °C."},
]


def test_chat_template_renders_tools_and_all_roles(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|begin_of_text|><|im_start|>system\nYou are terse.\n\n")
    assert text.count("<|im_start|>system") == 1  # the system message merged into the tools block
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert "<|im_start|>user\nWeather in Oslo?<|im_end|>\n" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert '<|im_start|>tool\n<tool_response>\n{"temp_c": 4}\n</tool_response><|im_end|>\n' in text
    assert "<|im_start|>tool\n<tool_response>\n\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n4 °C.<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_without_tools(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    assert ids.count(tokenizer.bos_token_id) == 1


def test_greedy_generation_is_varied_clean_text(model, tokenizer):
    messages = [{"role": "user", "content": "Tell me a story about a fox."}]
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=30, do_sample=False)
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    assert len(new) == 30  # greedy never picks an end token
    assert len(set(new)) >= 10
    text = tokenizer.decode(new)
    assert "\ufffd" not in text and "<|" not in text and "<tool_call>" not in text


def test_sampling_rarely_ends(model, tokenizer):
    enc = tokenizer("Once upon a time", return_tensors="pt")
    with torch.no_grad():
        probs = model(**enc).logits[0].softmax(-1)
    ends = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|end_of_text|>"])
    assert probs[:, ends].sum(-1).max() < 1e-2
    assert (probs[:, ends] > 0).all()  # possible, though


def test_ensure_demo_model_builds_once(tmp_path):
    path = ensure_demo_model(tmp_path)
    assert path == tmp_path / "greenroom-demo-tiny"
    weights = path / "model.safetensors"
    before = (path.stat().st_ino, weights.stat().st_mtime_ns)
    assert ensure_demo_model(tmp_path) == path
    assert (path.stat().st_ino, weights.stat().st_mtime_ns) == before


def test_ensure_demo_model_rebuilds_stale_version(tmp_path):
    path = ensure_demo_model(tmp_path)
    (path / "greenroom.json").write_text(json.dumps({"generator_version": -1, "size": "tiny", "seed": 0}))
    assert ensure_demo_model(tmp_path) == path
    assert json.loads((path / "greenroom.json").read_text())["generator_version"] == GENERATOR_VERSION


def test_ensure_demo_model_concurrent_callers(tmp_path):
    # flock conflicts between separate open()s even within one process, so
    # threads exercise the same lock two processes would.
    results, errors = [], []

    def call():
        try:
            results.append(ensure_demo_model(tmp_path))
        except BaseException as e:  # surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [tmp_path / "greenroom-demo-tiny"] * 3
    assert {p.name for p in results[0].iterdir()} == EXPECTED_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == [".greenroom-demo-tiny.lock", "greenroom-demo-tiny"]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GREENROOM_CACHE", str(tmp_path / "gr"))
    assert default_cache_dir() == tmp_path / "gr" / "models"
    monkeypatch.delenv("GREENROOM_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "greenroom" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "greenroom" / "models"


@pytest.mark.parametrize("size, low, high", [("tiny", 0.9e6, 3e6), ("100m", 90e6, 110e6), ("1b", 0.95e9, 1.1e9)])
def test_size_parameter_counts(size, low, high):
    # Shapes only: a meta-device model allocates no memory.
    settings = {k: v for k, v in SIZES[size].items() if k != "dtype"}
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**settings, tie_word_embeddings=False))
    assert low < model.num_parameters() < high
