"""The configuration (greenroom/config.py): a user's file over configs/default.toml, or in place
of it with `defaults = false`; every key but `models` and `cors_origins` set by its
GREENROOM_<KEY> variable, parsed to the key's type (tests/live/test_config.py: as `serve` reads it)."""

from __future__ import annotations

import attrs
import pytest

from greenroom.config import Config, budget_bytes, env_names, load_config

DEFAULT_IDS = [m.id for m in load_config().models]


def write(tmp_path, text: str):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return path


def test_a_one_line_file_keeps_every_default_model(tmp_path):
    config = load_config(write(tmp_path, f'model_dirs = ["{tmp_path}"]\n'), env={})
    assert [m.id for m in config.models] == DEFAULT_IDS and "smollm2-135m-instruct" in DEFAULT_IDS
    assert config.model_dirs == [str(tmp_path)] and config.port == 8000


def test_an_entry_of_a_default_id_changes_its_keys_and_others_add_models(tmp_path):
    text = """
gguf_threads = 2
[[models]]
id = "greenroom-demo"
preload = false
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
actor = "cpu1"
[[models]]
id = "extra"
source = "demo:tiny"
"""
    config = load_config(write(tmp_path, 'engine_actors = ["cpu", "cpu1"]\n' + text), env={})
    demo = [m for m in config.models if m.id == "greenroom-demo"]
    # the first entry changed the default's preload only; the second is a replica of it
    assert (demo[0].preload, demo[0].source, demo[0].sae, demo[0].actor) == (False, "demo:tiny", "demo:tiny", "auto")
    assert len(demo) == 2 and demo[1].actor == "cpu1" and demo[1].sae is None
    assert [m.id for m in config.models] == DEFAULT_IDS + ["greenroom-demo", "extra"]
    assert config.gguf_threads == 2


def test_defaults_false_starts_from_empty(tmp_path):
    config = load_config(write(tmp_path, 'defaults = false\n[[models]]\nid = "x"\nsource = "demo:tiny"\n'), env={})
    assert [m.id for m in config.models] == ["x"] and config.engine_actors == "auto"
    with pytest.raises(ValueError, match="defaults is true"):
        load_config(write(tmp_path, 'defaults = "no"\n'), env={})


# a value of each type that differs from the default and passes the checks load_config makes
SAMPLES = {bool: "no", int: "7", float: "0.75", str: "x"}
SPECIAL = {
    "fixed_shape": ("off", "off"),
    "log_level": ("debug", "debug"),
    "engine_actors": ("cpu,cpu1", ["cpu", "cpu1"]),
    "npu_actors": ("npu1", "npu1"),
    "model_dirs": ("/a, /b", ["/a", "/b"]),
    "workers_listen": ("127.0.0.1:7790", "127.0.0.1:7790"),
    "intensity_max": ("1.5", 1.5),
    "pin_cpus": ("0", False),
    "expose_extras": ("off", False),
    "continuous_batching": ("yes", True),
    "needle_strict_model": ("true", True),
    "memory_budget": ("800MB", "800MB"),
    "evict_pinned": ("no", False),
}


@pytest.mark.parametrize("field", [f for f in attrs.fields(Config) if env_names(f.name)], ids=lambda f: f.name)
def test_every_key_but_two_has_its_variable(field, monkeypatch):
    kind = next(t for t in (bool, int, float, str) if t is field.type or t in getattr(field.type, "__args__", ()))
    text, value = SPECIAL.get(field.name, (SAMPLES[kind], kind(SAMPLES[kind]) if kind is not bool else False))
    monkeypatch.setenv("GREENROOM_WORKER_TOKEN", "t" * 32)  # workers_listen needs it (read where the link is)
    env = {f"GREENROOM_{field.name.upper()}": text}
    assert getattr(load_config(env=env), field.name) == value != field.default
    assert {f.name for f in attrs.fields(Config) if not env_names(f.name)} == {"models", "cors_origins"}


def test_ollamas_scheduler_variables_set_the_limits_and_a_budget_reads_its_unit():
    env = {"OLLAMA_MAX_LOADED_MODELS": "2", "OLLAMA_NUM_PARALLEL": "3", "OLLAMA_MAX_QUEUE": "7"}
    config = load_config(env={**env, "GREENROOM_MEMORY_BUDGET": "1.5GiB"})
    assert (config.max_loaded_models, config.gguf_parallel, config.max_queue) == (2, 3, 7)
    assert budget_bytes(config) == 3 * 2**29
    assert budget_bytes(load_config(env={"GREENROOM_MEMORY_BUDGET": "800MB"})) == 800 * 10**6
    assert budget_bytes(load_config(env={"GREENROOM_MEMORY_BUDGET": "123456"})) == 123456
    assert load_config(env={"GREENROOM_MAX_LOADED_MODELS": "1", **env}).max_loaded_models == 1  # greenroom's first


def test_a_negative_model_cap_stops_the_start():
    with pytest.raises(ValueError, match="max_loaded_models is a count"):
        load_config(env={"OLLAMA_MAX_LOADED_MODELS": "-1"})


def test_the_prefix_cache_is_sized_from_memory_unless_a_token_count_is_given(tmp_path):
    assert load_config(env={}).prefix_cache_tokens is None  # the engine sizes it from memory
    assert load_config(write(tmp_path, "prefix_cache_tokens = 8192\n"), env={}).prefix_cache_tokens == 8192
    assert load_config(env={"GREENROOM_PREFIX_CACHE_TOKENS": "0"}).prefix_cache_tokens == 0  # off
    with pytest.raises(ValueError, match="prefix_cache_tokens is a count"):
        load_config(env={"GREENROOM_PREFIX_CACHE_TOKENS": "-1"})


@pytest.mark.parametrize("budget", ["lots", "-1GiB", "0", "12 parsecs", "GiB"])
def test_a_budget_that_is_not_a_size_stops_the_start(budget):
    with pytest.raises(ValueError, match="memory_budget is a size"):
        load_config(env={"GREENROOM_MEMORY_BUDGET": budget})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GREENROOM_GGUF_THREADS": "many"}, "GREENROOM_GGUF_THREADS='many': not an integer"),
        ({"GREENROOM_PIN_CPUS": "maybe"}, "GREENROOM_PIN_CPUS='maybe': not a boolean"),
        ({"GREENROOM_IDLE_UNLOAD_S": "nan"}, "GREENROOM_IDLE_UNLOAD_S='nan': not a number"),
        ({"NEEDLE_REQUEST_TIMEOUT": "soon"}, "NEEDLE_REQUEST_TIMEOUT='soon': not a number"),
    ],
)
def test_a_bad_value_names_its_variable(env, message):
    with pytest.raises(ValueError, match=message):
        load_config(env=env)


def test_a_blob_limit_is_a_size():
    assert load_config(env={"GREENROOM_MAX_BLOB_BYTES": "1"}).max_blob_bytes == 1
    with pytest.raises(ValueError, match="max_blob_bytes is a size in bytes"):
        load_config(env={"GREENROOM_MAX_BLOB_BYTES": "0"})


def test_other_names_and_empty_variables():
    config = load_config(env={"NEEDLE_STRICT_MODEL": "true", "GREENROOM_REQUEST_TIMEOUT": "3", "GREENROOM_PORT": ""})
    assert config.needle_strict_model and config.request_timeout_s == 3.0 and config.port == 8000
    # GREENROOM_<KEY> wins over the other names
    assert load_config(env={"GREENROOM_API_KEY": "a", "NEEDLE_API_KEY": "b"}).api_key == "a"
