"""Automatic prefix reuse on the transformers engine (engines/transformers/prefix_cache.py): a prompt that
starts with a prefix an earlier prompt computed prefills only the rest, with the same tokens as
a full prefill; steering is part of the key; the store is bounded and shown in /metrics."""

import json
import shutil

import httpx
import pytest
from conftest import MODEL

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_sae import demo_sae_dir, demo_sae_layers
from greenroom.engines.generation import generate
from greenroom.engines.sae import load_sae
from greenroom.engines.steering import SteeringState
from greenroom.engines.transformers.prefix_cache import BLOCK
from greenroom.engines.transformers.transformers_engine import TransformersEngine

from .test_metrics import sample

STORY = "The lighthouse keeper wrote in his log every night, about the sea, the ships and the gulls. "


def mixed(engine, n: int) -> list[tuple[list[int], SamplingParams]]:
    """`n` prompts sharing prefixes of different lengths (and some sharing none), greedy and seeded."""
    out = []
    for i in range(n):
        shared = STORY * (1 + i % 4)
        text = shared[: len(shared) - 7 * (i % 5)] + f" Question {i}: what came next?" if i % 6 else f"Alone {i}"
        params = (
            SamplingParams(max_tokens=8, temperature=0)
            if i % 3
            else SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=i)
        )
        out.append((engine.tokenize(text), params))
    return out


def texts(engine, requests) -> list[list[str]]:
    return [[d.text for d in generate(engine, ids, params)] for ids, params in requests]


@pytest.mark.parametrize("size,n", [("tiny", 50), ("100m", 8)])  # bench/prefix_reuse.py: 50 on 100m
def test_reuse_gives_the_tokens_of_a_full_prefill(model_cache, size, n):
    """Mixed requests (greedy and seeded), with and without reuse: 0 differences."""
    path = ensure_demo_model(default_cache_dir(), size)
    plain, reusing = TransformersEngine(MODEL, path), TransformersEngine(MODEL, path, prefix_cache_tokens=50_000)
    assert plain.prefix_cache is None
    requests = mixed(plain, n)
    assert texts(reusing, requests) == texts(plain, requests)
    stats = reusing.prefix_cache.stats()
    # a stored prefix shorter than the rest of its prompt is not taken (prefix_cache.py): a miss
    assert stats["hits"] >= n // 3 and stats["reused_tokens"] >= stats["hits"] * 2 * BLOCK, stats
    assert stats["hits"] + stats["misses"] == n


def test_steering_is_part_of_the_key(model_cache):
    """A prefix computed unsteered is not reused under steering (live or a request's own), and
    what each computes is what an engine without reuse computes."""
    path = ensure_demo_model(default_cache_dir(), "tiny")
    layer = demo_sae_layers("tiny")[0]
    engines = [TransformersEngine(MODEL, path), TransformersEngine(MODEL, path, prefix_cache_tokens=50_000)]
    for engine in engines:
        engine.steering.attach("sae", load_sae(demo_sae_dir(default_cache_dir(), "tiny", layer)))
    ids = engines[0].tokenize(STORY * 3)
    greedy = SamplingParams(max_tokens=12, temperature=0)
    runs = {}
    for name, engine in zip(("plain", "reusing"), engines):
        cache = engine.prefix_cache
        out = [[d.text for d in generate(engine, ids, greedy)]]  # unsteered: stored
        hits = cache.stats()["hits"] if cache else 0
        with engine.steering.steered(engine.steering.for_request({"sae": {3: 120.0}})):
            out.append([d.text for d in generate(engine, ids, greedy)])
        engine.steering.apply(SteeringState(1, True, {"sae": {5: -150.0}}))
        out.append([d.text for d in generate(engine, ids, greedy)])
        if cache:
            assert cache.stats()["hits"] == hits, "a prefix computed under other steering was reused"
            out.append([d.text for d in generate(engine, ids, greedy)])  # the same steering: reused
            assert cache.stats()["hits"] == hits + 1
        runs[name] = out
    assert runs["reusing"][:3] == runs["plain"] and runs["reusing"][3] == runs["plain"][2]
    assert len({"".join(t) for t in runs["plain"]}) == 3  # each steering changed the text


def test_readouts_prefill_every_position(model_cache):
    """A request reading the prompt's activations does not reuse a prefix (every position is read)."""
    engine = TransformersEngine(MODEL, ensure_demo_model(default_cache_dir(), "tiny"), prefix_cache_tokens=50_000)
    engine.steering.attach("sae", load_sae(demo_sae_dir(default_cache_dir(), "tiny", demo_sae_layers("tiny")[0])))
    ids = engine.tokenize(STORY * 2)
    list(generate(engine, ids, SamplingParams(max_tokens=2, temperature=0)))
    readout = engine.steering.readout(len(ids), positions="prompt", top_k=2)
    list(generate(engine, ids, SamplingParams(max_tokens=2, temperature=0), readout=readout))
    assert len(readout.result(ids).positions) == len(ids)
    assert engine.prefix_cache.stats()["hits"] == 0


def test_bounded_least_recently_used_first(model_cache):
    """The store keeps at most its bound of tokens; the least recently used prompt goes first."""
    engine = TransformersEngine(MODEL, ensure_demo_model(default_cache_dir(), "tiny"), prefix_cache_tokens=300)
    cache, greedy = engine.prefix_cache, SamplingParams(max_tokens=1, temperature=0)
    prompts = [engine.tokenize(f"Prompt {i}. " + STORY * 2) for i in range(4)]  # ~90 tokens each
    for ids in prompts[:3]:
        list(generate(engine, ids, greedy))
    list(generate(engine, prompts[0] + [5], greedy))  # a hit: prompt 0 is now the most recent
    list(generate(engine, prompts[3], greedy))  # past the bound: prompt 1 goes
    assert 0 < cache.stats()["tokens"] <= 300
    hits = cache.stats()["hits"]
    for i, reused in ((0, True), (1, False), (3, True)):
        list(generate(engine, prompts[i] + [7], greedy))
        assert cache.stats()["hits"] == hits + reused, i
        hits += reused


def test_shown_in_metrics(server):
    """/metrics shows each model's store: its bound (by default a quarter of the memory available
    at load, far above the 8,192 tokens it was), what it holds, and its hits and misses."""

    def complete(prompt: str) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    assert complete(STORY * 2 + "Metrics.") == complete(STORY * 2 + "Metrics.")
    text = httpx.get(server.url + "/metrics", timeout=10).text
    figure = {
        name: sample(text, f"greenroom_prefix_cache_{name}", actor="cpu", model=MODEL)
        for name in ("max_bytes", "max_tokens", "tokens", "bytes", "entries", "hits", "misses", "reused_tokens")
    }
    assert figure["max_bytes"] > 2**27 and figure["max_tokens"] > 8192  # this machine has GBs available
    assert 0 < figure["tokens"] <= figure["max_tokens"] and 0 < figure["bytes"] <= figure["max_bytes"]
    assert figure["entries"] >= 1 and figure["hits"] >= 1 and figure["reused_tokens"] >= 2 * BLOCK


def test_off_for_sliding_window_models(model_cache, tmp_path):
    """A sliding-window layer's cache may already have dropped what a stored prefix needs:
    neither prefix reuse nor the fixed-shape step (nor batching) runs there."""
    path = tmp_path / "sliding"
    shutil.copytree(ensure_demo_model(default_cache_dir(), "tiny"), path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    engine = TransformersEngine(MODEL, path, prefix_cache_tokens=50_000, fixed_shape="on")
    assert engine.prefix_cache is None and not engine.fixed_shape and not engine.batchable
    ids = engine.tokenize(STORY)
    assert len(list(generate(engine, ids, SamplingParams(max_tokens=3, temperature=0)))) == 3
