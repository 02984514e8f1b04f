"""The fixed-shape decode step (engines/transformers/fixed_shape.py), forced on for the CPU (`fixed_shape = "on"`;
"auto" selects it on CUDA only, compiled): the same greedy tokens as the eager path, serial and
batched, steered or not, and the steering is a buffer's contents, never a different graph."""

import httpx
import pytest
from conftest import MODEL, staggered_batch

from greenroom.engines.base import SamplingParams
from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_sae import demo_sae_dir, demo_sae_layers
from greenroom.engines.generation import generate
from greenroom.engines.sae import load_sae
from greenroom.engines.steering import SteeringState
from greenroom.engines.transformers.transformers_engine import TransformersEngine


def engines(size: str, **fixed) -> tuple[TransformersEngine, TransformersEngine]:
    path = ensure_demo_model(default_cache_dir(), size)
    eager = TransformersEngine(MODEL, path, fixed_shape="off")
    fast = TransformersEngine(MODEL, path, fixed_shape="on", fixed_shape_length=192, **fixed)
    assert not eager.fixed_shape and fast.fixed_shape
    return eager, fast


def text(engine, ids, params) -> list[str]:
    return [d.text for d in generate(engine, ids, params)]


def test_selected_on_cuda_only(model_cache):
    path = ensure_demo_model(default_cache_dir(), "tiny")
    assert not TransformersEngine(MODEL, path).fixed_shape  # "auto" on the CPU


@pytest.mark.parametrize("size,tokens", [("tiny", 24), ("100m", 6)])
def test_greedy_tokens_equal_the_eager_path(model_cache, size, tokens):
    """20 prompts of different lengths, the serial path."""
    eager, fast = engines(size)
    greedy = SamplingParams(max_tokens=tokens, temperature=0)
    prompts = [eager.tokenize(f"Story {i} about the sea" + " and the lighthouse" * (i % 6)) for i in range(20)]
    assert [text(fast, p, greedy) for p in prompts] == [text(eager, p, greedy) for p in prompts]
    assert fast._serial_step is not None and not fast._serial_step_busy  # the steps ran there


def test_batch_in_slots_equals_serial_eager(model_cache):
    """Sequences joining at different steps, one with a stop, decoded in the batch's slots."""
    eager, fast = engines("tiny", fixed_shape_slots=6)
    texts, reasons, serial = staggered_batch(eager, fast)
    assert texts == dict(enumerate(serial)) and reasons[2] == "stop"


def test_steering_is_the_buffer_not_the_graph(model_cache):
    """Live and per-request steering give the eager path's tokens; the buffer the step adds
    keeps its shape and storage whatever the steering."""
    eager, fast = engines("tiny")
    layer = demo_sae_layers("tiny")[0]
    for engine in (eager, fast):
        engine.steering.attach("sae", load_sae(demo_sae_dir(default_cache_dir(), "tiny", layer)))
    ids = eager.tokenize("The keeper of the lighthouse")
    greedy = SamplingParams(max_tokens=16, temperature=0)
    runs = {}
    for name, engine in (("eager", eager), ("fast", fast)):
        out = [text(engine, ids, greedy)]
        with engine.steering.steered(engine.steering.for_request({"sae": {3: 120.0}})):
            out.append(text(engine, ids, greedy))
        engine.steering.apply(SteeringState(1, True, {"sae": {5: -150.0}}))
        out.append(text(engine, ids, greedy))
        engine.steering.apply(SteeringState(2, True, {}))
        runs[name] = out
    assert runs["fast"] == runs["eager"] and len({"".join(t) for t in runs["eager"]}) == 3
    buffer = fast._serial_step._steer
    assert buffer.shape == (fast.model.config.num_hidden_layers, 1, 1, fast.model.config.hidden_size)
    storage = buffer.data_ptr()
    fast.steering.apply(SteeringState(3, True, {"sae": {7: 90.0}}))
    text(fast, ids, greedy)
    assert fast._serial_step._steer.data_ptr() == storage and bool(buffer[layer].any())


def test_served_on_the_fixed_shape_path(own_server):
    """A server with the path forced on answers greedy requests as the eager engine does, and
    serves batched ones (continuous batching on: the batch's slots)."""
    srv = own_server(
        f'fixed_shape = "on"\ncontinuous_batching = true\nfixed_shape_length = 256\n'
        f'[[models]]\nid = "{MODEL}"\nsource = "demo:tiny"\n'
    )
    eager = TransformersEngine(MODEL, ensure_demo_model(default_cache_dir(), "tiny"), fixed_shape="off")

    def complete(prompt: str, **extra) -> dict:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, **extra}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    for i in range(4):
        served = complete(f"Tale {i}", temperature=0)["choices"][0]["text"]
        assert served == "".join(text(eager, eager.tokenize(f"Tale {i}"), SamplingParams(max_tokens=12, temperature=0)))
    assert complete("Tale")["usage"]["completion_tokens"] >= 1  # the fixed sampling: batched
