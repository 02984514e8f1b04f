"""The engine actor's scheduling policy (actors/scheduling.py), with no server: given the
queue, what runs and how each model batches, what starts this turn and in which lane."""

import collections
from types import SimpleNamespace

import attrs

from greenroom.actors.scheduling import FIXED_SAMPLING, Lane, ModelBatching, SchedulingPolicy
from greenroom.engines.base import JsonObjectConstraint, MonitorRequest, ReadoutRequest, SamplingParams
from greenroom.protocol import Embed, Generate, Load, Score, Unload

ON = SchedulingPolicy(continuous_batching=True)
OFF = SchedulingPolicy(continuous_batching=False)
# how the engines describe themselves: transformers batches under the flag (fixed sampling only),
# llama.cpp batches any sampling in a fixed number of slots, a sliding-window model never batches
MODELS = {
    "tf": ModelBatching(batches=True),
    "gguf": ModelBatching(batches=True, any_sampling=True, capacity=2),
    "sliding": ModelBatching(),
}


def gen(rid: str, model: str = "tf", params: SamplingParams = FIXED_SAMPLING, **fields) -> Generate:
    return Generate(rid, model, params, **{"prompts": ["hi"], **fields})


def schedule(queued, policy=ON, serial=False, batched=None, models=MODELS) -> list[tuple[str, Lane]]:
    return [
        (start.request.rid, start.lane)
        for start in policy.schedule(queued, models, serial=serial, batched=batched or {})
    ]


def test_batchable_requests_at_the_head_start_together_in_queue_order():
    queued = collections.deque([gen("a"), gen("b", "gguf"), gen("c")])  # the engine loop's own queue type
    assert schedule(queued) == [("a", Lane.BATCH), ("b", Lane.BATCH), ("c", Lane.BATCH)]


def test_at_most_one_request_off_the_batches_starts_after_them_and_nothing_behind_it():
    queued = [gen("a"), gen("b", params=SamplingParams(temperature=0)), gen("c"), gen("d")]
    assert schedule(queued) == [("a", Lane.BATCH), ("b", Lane.SERIAL)]


def test_a_non_batchable_request_waits_for_the_serial_path_and_blocks_those_behind_it():
    queued = [gen("a", params=SamplingParams(temperature=0)), gen("b")]
    assert schedule(queued, serial=True) == []  # b could join the batch, but a is ahead of it
    assert schedule(queued, serial=True, batched={"tf": 3}) == []
    assert schedule(queued, serial=False) == [("a", Lane.SERIAL)]


def test_embed_and_score_take_the_serial_path():
    embed, score = Embed("e", "tf", texts=["hi"]), Score("s", "tf", 1.0, None, 1, prompts=["hi"])
    assert schedule([embed, gen("a")]) == [("e", Lane.SERIAL)]
    assert schedule([gen("a"), score, embed]) == [("a", Lane.BATCH), ("s", Lane.SERIAL)]
    assert schedule([score], serial=True) == []


def test_load_and_unload_start_only_once_nothing_runs():
    load, unload = Load("l", {"id": "new"}), Unload("u", "tf")
    assert schedule([load, gen("a")]) == [("l", Lane.LIFECYCLE)]  # alone: nothing behind it starts
    assert schedule([unload], serial=True) == []
    assert schedule([unload], batched={"gguf": 1}) == []
    assert schedule([unload], batched={"tf": 0}) == [("u", Lane.LIFECYCLE)]  # an empty batch runs nothing
    # nor in the turn where requests ahead of it start: it waits for them to finish
    assert schedule([gen("a"), unload, gen("b")]) == [("a", Lane.BATCH)]
    assert schedule([gen("a", params=SamplingParams(seed=1)), unload]) == [("a", Lane.SERIAL)]


def test_the_continuous_batching_flag_batches_only_the_fixed_sampling_parameters():
    assert schedule([gen("a")], policy=OFF) == [("a", Lane.SERIAL)]
    assert schedule([gen("a")], policy=ON) == [("a", Lane.BATCH)]
    # what the batch samples alike: any other temperature, top_p, top_k, penalty, or a seed, is served alone
    for other in (
        dict(temperature=0),
        dict(temperature=0.7),
        dict(top_p=0.9),
        dict(top_k=40),
        dict(repetition_penalty=1.1),
        dict(seed=7),
    ):
        assert schedule([gen("a", params=SamplingParams(**other))]) == [("a", Lane.SERIAL)], other
    # each row keeps its own length and stops
    assert schedule([gen("a", params=SamplingParams(max_tokens=5, stop=("\n",)))]) == [("a", Lane.BATCH)]


def test_an_engine_that_batches_any_sampling_batches_with_the_flag_off_too():
    sampled = SamplingParams(temperature=0.3, top_p=0.8, top_k=5, seed=11, repetition_penalty=1.2)
    for policy in (ON, OFF):
        assert schedule([gen("a", "gguf", sampled), gen("b", "gguf")], policy) == [("a", Lane.BATCH), ("b", Lane.BATCH)]


def test_an_engine_that_does_not_batch_and_an_unknown_model_take_the_serial_path():
    assert schedule([gen("a", "sliding"), gen("b")]) == [("a", Lane.SERIAL)]
    assert schedule([gen("a", "nowhere")]) == [("a", Lane.SERIAL)]  # its runner answers model_not_found


def test_requests_that_read_or_steer_one_sequence_per_forward_never_batch():
    one_of_each = [
        dict(constraint=JsonObjectConstraint()),
        dict(sae_activations=ReadoutRequest("s", None, 4, "all", "pre_steering")),
        dict(monitor=MonitorRequest("s", 4)),
        dict(request_strengths={"s": {3: 2.0}}),
        dict(request_strengths={}),  # even unsteered: a profile request is served serially
        dict(n=2),
        dict(prompts=["one", "two"]),
        dict(prompts=None, conversations=[[], []]),
    ]
    for fields in one_of_each:
        for model in ("tf", "gguf"):
            assert not ON.batchable(gen("a", model, **fields), MODELS[model]), fields
            assert schedule([gen("a", model, **fields), gen("b", model)]) == [("a", Lane.SERIAL)], fields
    assert ON.batchable(gen("a", prompts=None, conversations=[[{"role": "user", "content": "hi"}]]), MODELS["tf"])


def test_a_batch_takes_sequences_up_to_its_capacity():
    queued = [gen("a", "gguf"), gen("b", "gguf"), gen("c", "gguf")]
    assert schedule(queued) == [("a", Lane.BATCH), ("b", Lane.BATCH)]
    assert schedule(queued, batched={"gguf": 1}) == [("a", Lane.BATCH)]
    assert schedule([gen("a")] * 3, batched={"tf": 500}) == [("a", Lane.BATCH)] * 3  # no fixed number


def test_reported_log_probabilities_batch_only_where_each_sequence_samples_alone():
    asks = gen("a", params=SamplingParams(logprobs=3))
    assert not ON.batchable(asks, MODELS["tf"]) and ON.batchable(attrs.evolve(asks, model="gguf"), MODELS["gguf"])


def test_a_serial_request_needs_one_of_its_engines_sequences():
    serial = gen("s", "gguf", n=2)  # several choices: the serial path
    assert schedule([serial], batched={"gguf": 2}) == []  # every sequence taken (the batch's, or the serial one's)
    assert schedule([serial], batched={"gguf": 1}) == [("s", Lane.SERIAL)]
    assert schedule([gen("a", "gguf"), serial], batched={"gguf": 1}) == [("a", Lane.BATCH)]  # it waits, FIFO
    assert schedule([gen("s", "tf", n=2)], batched={"tf": 500}) == [("s", Lane.SERIAL)]  # no fixed number


def test_a_full_batch_stops_the_queue():
    behind = [gen("full", "gguf"), gen("b"), gen("c", params=SamplingParams(seed=1)), Unload("u", "tf")]
    assert schedule(behind, batched={"gguf": 2}) == []  # FIFO: nothing starts past it, even with room
    assert schedule(behind, batched={"gguf": 1}) == [("full", Lane.BATCH), ("b", Lane.BATCH), ("c", Lane.SERIAL)]


def test_a_model_is_described_by_what_its_engine_declares():
    llama = SimpleNamespace(batchable=True, batches_any_sampling=True, parallel=4)
    assert ModelBatching.of(llama) == ModelBatching(batches=True, any_sampling=True, capacity=4)
    assert ModelBatching.of(SimpleNamespace(batchable=False)) == ModelBatching()
    assert ModelBatching.of(SimpleNamespace()) == ModelBatching()  # an engine that never batches declares nothing
