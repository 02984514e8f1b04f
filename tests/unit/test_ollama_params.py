"""Ollama's `options` (greenroom/http/ollama/ollama_params.py) as a function of the sent object and an
engine's capabilities: the defaults merged, each option mapped onto SamplingParams, the window,
the reported locations, and a typed 400 naming the option for every bad value. No server;
tests/live/test_ollama.py drives the same options through a live one."""

from __future__ import annotations

import pytest

from greenroom.engines.base import SEED_MAX
from greenroom.engines.capabilities import ENGINES, Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.ollama.ollama_params import resolve, shown, window

ALL = ENGINES["transformers"]
# Ollama's merged defaults (the spec's table) as greenroom maps them
DEFAULTS = dict(max_tokens=128, temperature=0.8, top_p=0.9, top_k=40, stop=(), seed=None, repetition_penalty=1.1)


@pytest.mark.parametrize(
    "options, params",
    [
        (None, {}),
        ({}, {}),
        ({"temperature": 0, "top_p": 0.5, "top_k": 3}, dict(temperature=0.0, top_p=0.5, top_k=3)),
        ({"temperature": None}, {}),  # Ollama skips nulls
        ({"num_predict": 5.0}, dict(max_tokens=5)),  # an integral float is an int
        ({"num_predict": 0}, dict(max_tokens=0)),
        ({"num_predict": -1}, dict(max_tokens=None)),
        ({"num_predict": -2}, dict(max_tokens=None)),
        ({"stop": "x"}, dict(stop=("x",))),
        ({"stop": ["a", "b"]}, dict(stop=("a", "b"))),
        ({"seed": 7}, dict(seed=7)),
        ({"seed": -5}, dict(seed=None)),  # any negative: drawn per request
        ({"seed": SEED_MAX}, dict(seed=SEED_MAX)),
        ({"repeat_penalty": 1.3}, dict(repetition_penalty=1.3)),
        ({"presence_penalty": 0.4, "frequency_penalty": 0.2}, dict(repetition_penalty=1.3)),
        ({"presence_penalty": -4}, dict(repetition_penalty=0.1)),  # floored: a penalty stays > 0
        ({"repeat_penalty": 1.2, "presence_penalty": 1.0}, dict(repetition_penalty=1.2)),  # explicit wins
    ],
)
def test_options_map_onto_sampling_params_over_the_defaults(options, params):
    got = resolve(options, ALL).params
    for name, value in (DEFAULTS | params).items():
        assert getattr(got, name) == pytest.approx(value) if isinstance(value, float) else getattr(got, name) == value


@pytest.mark.parametrize(
    "options, fill, num_ctx, num_keep",
    [
        ({}, False, None, 4),
        ({"num_predict": -1}, True, None, 4),
        ({"num_predict": -2}, True, None, 4),
        ({"num_predict": 10}, False, None, 4),
        ({"num_ctx": 100, "num_keep": 10}, False, 100, 10),
        ({"num_ctx": 0}, False, 0, 4),  # clamped by `window`, never refused
    ],
)
def test_the_length_and_window_options(options, fill, num_ctx, num_keep):
    got = resolve(options, ALL)
    assert (got.fill, got.num_ctx, got.num_keep) == (fill, num_ctx, num_keep)


@pytest.mark.parametrize(
    "options, unread",
    [
        ({"temperature": 0.1, "seed": 1, "num_ctx": 8}, []),
        ({"foo": 1, "bar": None}, ["options.foo", "options.bar"]),  # unknown: reported, even a null
        ({"mirostat": 0, "min_p": 0.0, "num_batch": 512}, []),  # dropped, but the no-change value
        ({"mirostat": 2, "min_p": 0.05}, ["options.mirostat", "options.min_p"]),
        ({"numa": False, "use_mmap": False}, []),  # a flag with no default: false asks for nothing
        ({"numa": True, "num_gpu": 0, "num_thread": 4}, ["options.numa", "options.num_gpu", "options.num_thread"]),
    ],
)
def test_unknown_and_dropped_options_are_reported(options, unread):
    assert resolve(options, ALL).unread == unread


@pytest.mark.parametrize(
    "options, param, message",
    [
        ("hot", "options", "'options' must be an object"),
        ([1], "options", "'options' must be an object"),
        ({"temperature": "hot"}, "options.temperature", "must be a finite number"),
        ({"temperature": True}, "options.temperature", "must be a finite number"),
        ({"temperature": float("nan")}, "options.temperature", "must be a finite number"),
        ({"temperature": -0.5}, "options.temperature", "must be ≥ 0, got -0.5"),
        ({"top_k": 1.5}, "options.top_k", "must be an integer, got 1.5"),
        ({"top_k": -1}, "options.top_k", "must be ≥ 0"),
        ({"top_p": 1.5}, "options.top_p", "must be ≥ 0 and ≤ 1, got 1.5"),
        ({"repeat_penalty": 0}, "options.repeat_penalty", "must be > 0, got 0.0"),
        ({"num_predict": -3}, "options.num_predict", "must be ≥ -2"),
        ({"num_predict": 2**31}, "options.num_predict", "≤ 2.14748e+09"),
        ({"seed": SEED_MAX + 1}, "options.seed", "must be ≤"),
        ({"num_ctx": 2**63}, "options.num_ctx", "must be ≥"),  # past Go's int: Ollama's 400 too
        ({"stop": [1]}, "options.stop", "must be an array of strings"),
        ({"stop": {"a": 1}}, "options.stop", "must be an array of strings"),
        ({"numa": "yes"}, "options.numa", "must be a boolean"),
        ({"mirostat": 0.5}, "options.mirostat", "must be an integer"),  # dropped options are checked too
    ],
)
def test_a_bad_value_is_a_typed_400_naming_the_option(options, param, message):
    with pytest.raises(GreenroomError) as e:
        resolve(options, ALL)
    assert (e.value.code, e.value.param, e.value.status) == ("invalid_parameter", param, 400)
    assert message in e.value.message, e.value.message


@pytest.mark.parametrize(
    "options, refused",
    [
        ({"seed": 3}, "options.seed"),
        ({"repeat_penalty": 1.2}, "options.repeat_penalty"),
        ({"presence_penalty": 0.5}, "options.presence_penalty"),
        ({"seed": -1, "repeat_penalty": 1.1, "presence_penalty": 0, "frequency_penalty": 0.0}, None),  # no change
    ],
)
def test_an_option_the_engine_lacks_is_refused_unless_it_asks_for_nothing(options, refused):
    if refused is None:
        assert resolve(options, Capabilities()).params.seed is None
        return
    with pytest.raises(GreenroomError) as e:
        resolve(options, Capabilities())
    assert (e.value.code, e.value.param, e.value.status) == ("field_not_honoured", refused, 400)
    assert "cannot be honoured by this model's engine" in e.value.message


@pytest.mark.parametrize(
    "num_ctx, context_length, used",
    [
        (None, 8192, 2048),  # Ollama's default window
        (None, 1024, 1024),  # capped at the model's trained window
        (512, 8192, 512),
        (100_000, 8192, 8192),
        (0, 8192, 4),  # raised to the scheduler's floor
        (-5, 100, 4),
        (3, 2, 4),  # the floor wins over a tiny model's window
    ],
)
def test_the_window_is_clamped_as_ollama_clamps_it(num_ctx, context_length, used):
    options = {} if num_ctx is None else {"num_ctx": num_ctx}
    assert window(resolve(options, ALL), context_length) == used


def test_show_lists_the_applied_defaults_under_a_models_own_parameters():
    defaults = dict(shown(1024, {}))
    assert defaults == {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.9,
        "repeat_penalty": 1.1,
        "num_predict": 128,
        "num_ctx": 1024,  # the default window, within the model's
        "seed": -1,
    }
    own = shown(8192, {"temperature": 0.1, "stop": ["<a>", "<b>"]})
    assert ("num_ctx", 2048) in own and ("temperature", 0.1) in own and ("temperature", 0.8) not in own
    assert [v for k, v in own if k == "stop"] == ["<a>", "<b>"]  # a list: one pair per element
