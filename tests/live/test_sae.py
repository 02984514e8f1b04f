"""SAEs and steering at the engine level, in-process (no server): the SAELens format, the
demo SAEs, steering through decoder directions, readouts, suppression, detach."""

import json
import shutil
import threading
from itertools import count

import pytest
import torch
from safetensors.torch import load_file, save_file

from greenroom.engines.base import EngineError, PositionRead, SamplingParams, Span
from greenroom.engines.demo.demo_model import SIZES, default_cache_dir, ensure_demo_model
from greenroom.engines.demo.demo_sae import demo_sae_dir, demo_sae_layers
from greenroom.engines.generation import generate
from greenroom.engines.sae import CFG_FILE, WEIGHTS_FILE, SAEFormatError, load_sae, save_sae
from greenroom.engines.steering import SteeringState
from greenroom.engines.transformers.transformers_engine import TransformersEngine

PROMPT = "Once upon a time, in a small village by the sea"
GREEDY = SamplingParams(max_tokens=8, temperature=0)
FIRST, SECOND = demo_sae_layers("tiny")
_ids = count()


@pytest.fixture(scope="module")
def sae_paths(model_cache):
    # `greenroom demo-model` (the model_cache fixture) builds both
    return [demo_sae_dir(default_cache_dir(), "tiny", layer) for layer in (FIRST, SECOND)]


@pytest.fixture(scope="module")
def engine(model_cache):
    return TransformersEngine("greenroom-demo", ensure_demo_model(default_cache_dir(), "tiny"))


@pytest.fixture
def attach(engine, sae_paths):
    """Attach demo SAEs under fresh ids; every one is detached after the test."""
    names = []

    def do(which: int = 0) -> str:
        names.append(f"sae_{next(_ids)}")
        engine.steering.attach(names[-1], load_sae(sae_paths[which]))
        return names[-1]

    yield do
    steer(engine, {})
    for name in names:
        engine.steering.detach(name)


def steer(engine, strengths: dict, enabled: bool = True) -> None:
    assert engine.steering.apply(SteeringState(engine.steering.state.version + 1, enabled, strengths))


def logits(engine, ids) -> torch.Tensor:
    """The next-token logits of a plain forward: steered whenever steering is on."""
    with torch.inference_mode():
        return engine.model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1].clone()


def read(engine, ids, **kw) -> list[PositionRead]:
    """The readout over the prompt only (one prefill forward)."""
    readout = engine.steering.readout(len(ids), **kw)
    gen = engine.generate_ids(ids, GREEDY, readout=readout)
    next(gen)
    gen.close()
    return readout.result(ids).positions


def value(entries: list[PositionRead], feature: int) -> float:
    (entry,) = entries
    return {f.index: f.value for f in entry.features}[feature]


def text(engine, ids) -> str:
    return "".join(d.text for d in generate(engine, ids, GREEDY))


# -- the SAELens format ------------------------------------------------------------------


def test_demo_saes_load_in_saelens_format(sae_paths, tmp_path):
    first, second = (load_sae(p) for p in sae_paths)
    d = SIZES["tiny"]["hidden_size"]
    assert (first.architecture, first.layer, first.block, first.hook_name) == (
        "standard",
        FIRST,
        FIRST,
        f"blocks.{FIRST}.hook_resid_post",
    )
    assert (second.architecture, second.layer, second.threshold is not None) == ("jumprelu", SECOND, True)
    assert (first.d_in, first.d_sae) == (d, 4 * d)
    assert torch.allclose(first.W_dec.norm(dim=1), torch.ones(4 * d))
    cfg = json.loads((sae_paths[0] / CFG_FILE).read_text())
    assert cfg["metadata"]["hook_name"] == first.hook_name and cfg["d_sae"] == 4 * d
    # written again and read back: the same tensors
    again = load_sae(save_sae(tmp_path / "copy", second))
    for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"):
        assert torch.equal(getattr(again, name), getattr(second, name))
    # jumprelu is relu gated at the threshold, as SAELens computes it
    x = torch.randn(3, d) * 2
    pre = (x - second.b_dec) @ second.W_enc + second.b_enc
    assert torch.equal(second.encode(x), torch.relu(pre) * (pre > second.threshold))
    # decoding one active feature gives its decoder row, offset by b_dec
    one = torch.zeros(second.d_sae)
    one[5] = 2.0
    assert torch.allclose(second.decode(one), 2 * second.W_dec[5] + second.b_dec)


def copy_of(path, tmp_path):
    return shutil.copytree(path, tmp_path / "sae")


def edit_cfg(path, **changes):
    cfg = json.loads((path / CFG_FILE).read_text())
    cfg.update(changes)
    (path / CFG_FILE).write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(architecture="topk"), "architecture 'topk' is not supported"),
        (dict(architecture="gated"), "architecture 'gated' is not supported"),
        (dict(normalize_activations="layer_norm"), "normalize_activations 'layer_norm' is not supported"),
        (dict(reshape_activations="hook_z"), "reshape_activations 'hook_z' is not supported"),
        # attention and MLP out are hook points now (test_strength_units.py steers them); these are not
        (dict(metadata={"hook_name": "blocks.1.hook_z"}), "'blocks.1.hook_z' is not a hook point"),
        (dict(metadata={"hook_name": "blocks.1.hook_mlp_in"}), "'blocks.1.hook_mlp_in' is not a hook point"),
        (dict(metadata={"hook_name": "blocks.0.hook_resid_pre"}), "'blocks.0.hook_resid_pre' is not a hook point"),
        (dict(d_sae=100), "W_enc has shape"),
    ],
)
def test_unsupported_or_inconsistent_cfg_is_refused(sae_paths, tmp_path, change, words):
    path = copy_of(sae_paths[0], tmp_path)
    edit_cfg(path, **change)
    with pytest.raises(SAEFormatError, match=words):
        load_sae(path)


def test_missing_tensor_or_file_is_refused(sae_paths, tmp_path):
    path = copy_of(sae_paths[1], tmp_path)
    weights = load_file(path / WEIGHTS_FILE)
    del weights["threshold"]
    save_file(weights, path / WEIGHTS_FILE)
    with pytest.raises(SAEFormatError, match="lacks threshold"):
        load_sae(path)
    (path / WEIGHTS_FILE).unlink()
    with pytest.raises(SAEFormatError, match="no sae_weights.safetensors"):
        load_sae(path)
    (path / CFG_FILE).unlink()
    with pytest.raises(SAEFormatError, match="no cfg.json"):
        load_sae(path)


def test_older_dumps_with_the_hook_at_the_top_level_load(sae_paths, tmp_path):
    path = copy_of(sae_paths[0], tmp_path)
    cfg = json.loads((path / CFG_FILE).read_text())
    meta = cfg.pop("metadata")
    del cfg["architecture"]  # SAELens defaults it to standard
    (path / CFG_FILE).write_text(
        json.dumps({**cfg, "hook_name": f"blocks.{FIRST + 1}.hook_resid_pre", "hook_layer": meta["hook_layer"] + 1})
    )
    sae = load_sae(path)
    assert (sae.architecture, sae.layer, sae.block) == ("standard", FIRST + 1, FIRST)


# -- steering ----------------------------------------------------------------------------


def test_attach_reports_width_layer_and_hook_point(engine, attach):
    name = attach(0)
    (info,) = [a for a in engine.steering.attached() if a.sae_id == name]
    assert (info.layer, info.block, info.hook_point, info.width, info.d_in, info.architecture) == (
        FIRST,
        FIRST,
        f"blocks.{FIRST}.hook_resid_post",
        512,
        128,
        "standard",
    )
    assert 5 < info.residual_norm < 50  # the demo residual has ~unit variance per channel: ≈ √128
    with pytest.raises(ValueError, match="already has SAE"):
        engine.steering.attach("again", load_sae(demo_sae_dir(default_cache_dir(), "tiny", FIRST)))


def test_steering_a_feature_up_raises_it_and_changes_the_logits_down_lowers_it(engine, attach):
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    base_logits = logits(engine, ids)
    (top,) = read(engine, ids, sae_id=name, top_k=1)[0].features
    i = top.index
    base = value(read(engine, ids, sae_id=name, features=[i]), i)
    assert base > 0

    steer(engine, {name: {i: 50}})
    up = value(read(engine, ids, sae_id=name, features=[i]), i)
    # the demo SAE's encoder reads its own decoder direction: +50 adds ρ/2 along it
    assert up > base + 0.4 * engine.steering.attached()[-1].residual_norm
    assert not torch.allclose(logits(engine, ids), base_logits)

    steer(engine, {name: {i: -50}})
    assert value(read(engine, ids, sae_id=name, features=[i]), i) < base

    steer(engine, {name: {i: 50}}, enabled=False)
    assert torch.equal(logits(engine, ids), base_logits)


def test_pre_and_post_steering_readouts_differ_only_while_steering(engine, attach):
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    pre = read(engine, ids, sae_id=name, positions="all", read_point="pre_steering")
    post = read(engine, ids, sae_id=name, positions="all", read_point="post_steering")
    assert pre == post
    steer(engine, {name: {7: 80}})
    pre_on = read(engine, ids, sae_id=name, positions="all", read_point="pre_steering", features=[7])
    post_on = read(engine, ids, sae_id=name, positions="all", read_point="post_steering", features=[7])
    assert all(b.features[0].value > a.features[0].value for a, b in zip(pre_on, post_on))


def test_readout_positions(engine, attach):
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    n = len(ids)

    def positions(spec):
        readout = engine.steering.readout(n, sae_id=name, positions=spec, top_k=3)
        fed = list(ids)
        for token, *_ in engine.generate_ids(ids, SamplingParams(max_tokens=3, temperature=0), readout=readout):
            fed.append(token)
            if len(fed) == n + 3:
                break
        entries = readout.result(fed).positions
        assert all(e.token_id == fed[e.position] and len(e.features) <= 3 for e in entries)
        return [e.position for e in entries]

    # three tokens sampled, two fed back: the last sampled token has no activation
    assert positions("all") == list(range(n + 2))
    assert positions("prompt") == list(range(n))
    assert positions("completion") == [n, n + 1]
    assert positions("last") == [n + 1]
    assert positions(Span(2, n + 1)) == list(range(2, n + 1))


def test_readout_and_steering_refusals(engine, attach):
    with pytest.raises(EngineError, match="no SAE is attached"):
        engine.steering.readout(4)
    first = attach(0)
    assert engine.steering.readout(4).sae_id == first  # the only one attached
    second = attach(1)
    with pytest.raises(EngineError, match="several SAEs are attached") as exc:
        engine.steering.readout(4)
    assert first in exc.value.message and second in exc.value.message
    with pytest.raises(EngineError) as exc:
        engine.steering.readout(4, sae_id=first, features=[3, 512])
    assert exc.value.code == "invalid_feature_index"
    with pytest.raises(EngineError, match="positions"):
        engine.steering.readout(4, sae_id=first, positions=Span(3, 3))
    held = engine.steering.state
    with pytest.raises(EngineError) as exc:
        engine.steering.apply(SteeringState(held.version + 1, True, {first: {1: 10}, second: {512: 10}}))
    assert exc.value.code == "invalid_feature_index" and engine.steering.state == held
    with pytest.raises(EngineError, match="not attached"):
        engine.steering.apply(SteeringState(held.version + 1, True, {"sae_nowhere": {1: 10}}))
    # a stale version is ignored
    steer(engine, {first: {1: 10}})
    assert not engine.steering.apply(SteeringState(engine.steering.state.version, True, {first: {2: 10}}))


def test_strengths_are_clamped_to_the_range(engine, attach):
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    steer(engine, {name: {5: 200}})
    at_end = logits(engine, ids)
    steer(engine, {name: {5: 1000}})
    assert torch.equal(logits(engine, ids), at_end)


# -- suppression, batching, detach -------------------------------------------------------------


def test_embeddings_and_scoring_are_unsteered_while_generation_stays_steered(engine, attach):
    name = attach(0)
    attach(1)  # every attached SAE is suppressed, not just one
    ids = engine.tokenize(PROMPT)
    embedding, scored, unsteered = engine.embed([ids]), engine.score(ids, 1.0, None, 5), logits(engine, ids)
    second = engine.steering.attached()[-1].sae_id
    steer(engine, {name: {3: 120}, second: {9: 120}})
    steered = logits(engine, ids)
    assert not torch.allclose(steered, unsteered)
    assert engine.embed([ids]) == embedding
    assert engine.score(ids, 1.0, None, 5) == scored
    assert torch.equal(logits(engine, ids), steered)  # the next forward is steered again


def test_suppression_is_for_its_own_thread_only(engine, attach):
    """An embedding or scoring pass on one thread leaves a generation on another steered."""
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    steer(engine, {name: {3: 120}})
    steered = logits(engine, ids)
    inside, release = threading.Event(), threading.Event()

    def hold():
        with engine.steering.suppressed():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    try:
        assert inside.wait(10)
        assert torch.equal(logits(engine, ids), steered)
    finally:
        release.set()
        other.join()


def test_batched_forwards_are_steered_as_serial_ones(engine, attach):
    name = attach(0)
    ids = engine.tokenize(PROMPT)
    plain = text(engine, ids)
    steer(engine, {name: {11: 150}})
    serial = text(engine, ids)
    assert serial != plain
    batch = engine.new_batch(SamplingParams(temperature=0))
    out = [batch.join([("a", ids, GREEDY)])[0].text]
    while len(batch):
        out += [delta.text for _, delta in batch.step()]
    assert "".join(out) == serial


def test_several_layers_at_once_and_detach_restores_exact_logits(engine, sae_paths):
    ids = engine.tokenize(PROMPT)
    base = logits(engine, ids)
    a = engine.steering.attach("layer_a", load_sae(sae_paths[0]))
    b = engine.steering.attach("layer_b", load_sae(sae_paths[1]))
    assert {(x.sae_id, x.layer) for x in (a, b)} == {("layer_a", FIRST), ("layer_b", SECOND)}
    assert torch.equal(logits(engine, ids), base)  # attached, not steered: nothing changes
    both = {"layer_a": {4: 60}, "layer_b": {4: 60}}
    steer(engine, {"layer_a": both["layer_a"]})
    only_a = logits(engine, ids)
    steer(engine, both)
    with_both = logits(engine, ids)
    assert not torch.allclose(with_both, only_a) and not torch.allclose(only_a, base)
    # each layer's own readout sees its own feature raised by its own steering
    for name in both:
        readout_on = value(read(engine, ids, sae_id=name, features=[4], positions="last"), 4)
        steer(engine, {})
        readout_off = value(read(engine, ids, sae_id=name, features=[4], positions="last"), 4)
        steer(engine, both)
        assert readout_on > readout_off
    engine.steering.detach("layer_b")
    assert torch.equal(logits(engine, ids), only_a)
    engine.steering.detach("layer_a")
    assert torch.equal(logits(engine, ids), base)
    steer(engine, {})
