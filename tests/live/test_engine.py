"""The transformers engine and the shared generation loop, in-process (no server)."""

import pytest

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.generation import generate
from greenroom.engines.transformers.transformers_engine import TransformersEngine


@pytest.fixture(scope="module")
def engine(model_cache):
    return TransformersEngine("greenroom-demo", ensure_demo_model(default_cache_dir(), "tiny"))


def run(engine, params, prompt="Once upon a time"):
    deltas = list(generate(engine, engine.tokenize(prompt), params))
    return "".join(d.text for d in deltas), deltas


def test_greedy_is_deterministic_and_honours_max_tokens(engine):
    a, deltas = run(engine, SamplingParams(max_tokens=12, temperature=0))
    b, _ = run(engine, SamplingParams(max_tokens=12, temperature=0))
    assert a == b and a
    assert deltas[-1].completion_tokens == 12 and deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_same_seed_same_text_other_seed_other_text(engine):
    p = dict(max_tokens=24, temperature=1.0)
    a, _ = run(engine, SamplingParams(**p, seed=7))
    b, _ = run(engine, SamplingParams(**p, seed=7))
    c, _ = run(engine, SamplingParams(**p, seed=8))
    assert a == b and a != c


def test_top_p_tiny_is_greedy(engine):
    greedy, _ = run(engine, SamplingParams(max_tokens=10, temperature=0))
    nucleus, _ = run(engine, SamplingParams(max_tokens=10, temperature=1.5, top_p=1e-6, seed=3))
    assert nucleus == greedy


def test_stop_string_spanning_tokens_ends_generation(engine):
    full, deltas = run(engine, SamplingParams(max_tokens=30, temperature=0))
    texts = [d.text for d in deltas if d.text]
    assert len(texts) >= 4
    stop = texts[2][-1] + texts[3][0]  # the last character of one token and the first of the next
    text, deltas = run(engine, SamplingParams(max_tokens=30, temperature=0, stop=(stop,)))
    assert deltas[-1].finish_reason == "stop"
    assert text == full[: full.index(stop)]


def test_chat_template_renders_generation_prompt(engine):
    ids = engine.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    text = engine.tokenizer.decode(ids)
    assert text.rstrip().endswith("assistant")


def test_top_k(engine):
    greedy, _ = run(engine, SamplingParams(max_tokens=10, temperature=0))
    one, _ = run(engine, SamplingParams(max_tokens=10, temperature=1.5, top_k=1, seed=3))
    assert one == greedy
    wide, _ = run(engine, SamplingParams(max_tokens=10, temperature=1.5, top_k=50, seed=3))
    assert wide != greedy
