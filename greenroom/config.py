"""Configuration: configs/default.toml, a user's file over it, then GREENROOM_<KEY> environment
variables, then CLI flags."""

from __future__ import annotations

import collections
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path

import attrs
import cattrs

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"


@attrs.define
class ModelConfig:
    id: str
    # "demo:<size>", "demo-gguf:<QUANT>", a checkpoint directory or a .gguf file; None: the file of
    # this id found below model_dirs, which the entry configures (served by llama.cpp)
    source: str | None = None
    engine: str = "transformers"  # or "llama.cpp": one actor of its own, spawned when the model loads
    # an engine actor: "auto" (chosen at each load: the first local one if the model fits, else a
    # worker host's with room), a local one (gpu0, cpu…), or a worker host's ("hostb/gpu0");
    # llama.cpp: "auto" (this host) or a worker host's name, where its actor is spawned
    actor: str = "auto"
    dtype: str | None = None
    # loaded when its actor starts; else on the first request (GGUF, and "auto" with no local
    # engine actor: always on demand)
    preload: bool = True
    n_ctx: int | None = None  # llama.cpp: context window (default: gguf_n_ctx; 0: the model's trained one)
    threads: int | None = None  # llama.cpp: decode threads (default: gguf_threads)
    # an SAE attached on the model's first start ("demo:<size>[:<layer>]" or an SAELens directory);
    # after that the steering store (store/steering.py) holds what is attached
    sae: str | None = None
    # a chat template over the model's own, any engine: a Jinja file's path, or the Jinja text itself
    chat_template: str | None = None


@attrs.define
class Config:
    host: str = "127.0.0.1"
    port: int = 8000
    ollama_port: int = 11434  # also serve on Ollama's port, so its CLI needs no OLLAMA_HOST; 0 = off
    log_level: str = "info"
    default_max_tokens: int = 512
    max_queue: int = 32
    engine_actors: str | list[str] = "auto"
    npu_actors: str | list[str] = "auto"  # npu0…npuN for OpenVINO; "auto": one per NPU, else npu0 on the CPU
    models: list[ModelConfig] = attrs.Factory(list)
    model_dirs: list[str] = attrs.Factory(list)  # *.gguf found below these are served as repo:QUANT
    # llama.cpp context window, capped at the model's trained context; None: from memory — the trained
    # window where gguf_parallel of it take at most a quarter of the available memory, else the largest
    # power of two that does, at least 4096 (engines/llama_cpp/gguf_meta.py default_window); 0: the trained one
    gguf_n_ctx: int | None = None
    gguf_threads: int = 0  # llama.cpp decode threads; 0: all cores but one
    gguf_parallel: int = 4  # llama.cpp sequences decoded together per model (each its own n_ctx of cache)
    # llama.cpp: MiB of prompt states kept in host RAM for prompts sharing a long head (llama-server's
    # --cache-ram; engines/llama_cpp/prompt_store.py); None: a quarter of the available memory, at most 8 GiB; 0: off
    gguf_cache_ram_mib: int | None = None
    # model swap (supervisor/eviction.py): a load that does not fit its device unloads idle models there,
    # least recently used first. The most models loaded per device at once (0: no limit, memory decides);
    max_loaded_models: int = 0
    # what everything loaded on the CPU may take ("12GiB", "800MB", bytes; None: available memory decides)
    memory_budget: str | None = None
    evict_pinned: bool = True  # a keep_alive -1 model may be unloaded for room, last (Ollama's rule)
    # an engine actor computing on one thread gets a CPU of its own, when one is free (cpus.py)
    pin_cpus: bool = True
    cache_dir: str | None = None  # cache root (models/ below it); default $GREENROOM_CACHE or ~/.cache/greenroom
    # the largest file POST /api/blobs stores (what `ollama create` uploads); past it: 413
    max_blob_bytes: int = 256 * 2**30
    restart_limit: int = 5  # restarts allowed within restart_window_s before an actor is left failed
    restart_window_s: float = 300.0
    ready_timeout_s: float = 120.0  # how long a request waits for its actor to (re)start
    expose_extras: bool = True  # the x_needle block on chat completions (--no-extras)
    api_key: str | None = None  # every route but /health and / then needs "Authorization: Bearer <key>"
    # browser origins allowed besides Ollama's defaults (localhost, 127.0.0.1, app://, …), `*` wildcards;
    # OLLAMA_ORIGINS and GREENROOM_ORIGINS add more (http/core/cors.py)
    cors_origins: list[str] = attrs.Factory(list)
    request_timeout_s: float | None = None  # past it, a request not yet answering is a 504 (and cancelled)
    idle_unload_s: float = 0.0  # unload a model idle this long (0: never); Ollama's keep_alive overrides it
    graceful_unload_timeout_s: float = 30.0  # GRACEFUL_UNLOAD_TIMEOUT: running requests' grace before an unload
    # SIGTERM/SIGINT: how long running requests may finish (new ones get 503) before what is left
    # ends with server_shutting_down (http/core/shutdown.py); within docker stop's 10 s with the teardown
    graceful_shutdown_timeout_s: float = 5.0
    continuous_batching: bool = False  # batch requests with the fixed sampling parameters (engine_actor.py)
    # streamed chunks a second the front end sends in all before it holds each stream's tokens to
    # fewer, larger chunks (http/core/pacing.py); 0: one chunk per engine event, whatever the load
    stream_chunks_per_s: float = 2000.0
    # transformers: the KV kept per model for automatic prefix reuse (engines/transformers/prefix_cache.py).
    # Unset: sized from memory — a quarter of the memory available on the model's device once its
    # weights are loaded (host memory on the CPU, at most 8 GiB; the card's free memory on CUDA), in bytes of KV;
    # a number: that many tokens of KV instead; 0: off
    prefix_cache_tokens: int | None = None
    # transformers: decode in fixed shapes (engines/transformers/fixed_shape.py), compiled on CUDA: "auto" (on CUDA), "on", "off";
    # a continuous batch holds fixed_shape_slots sequences, each of up to fixed_shape_length tokens (longer: eager)
    fixed_shape: str = "auto"
    fixed_shape_slots: int = 64
    fixed_shape_length: int = 2048
    # "ADDR:PORT" where worker hosts join (`greenroom worker --join`), over TLS keyed by
    # GREENROOM_WORKER_TOKEN (set on both hosts); unset: no worker can join
    workers_listen: str | None = None
    worker_timeout_s: float = 5.0  # a worker link silent this long is a lost host
    # steering_intensity (steering_rules.py): CLUSTER_INTENSITY_MIN, CIRCUIT_INTENSITY_MIN and
    # the server's maximum dial, all within [0, 2]
    cluster_intensity_min: float = 0.5
    circuit_intensity_min: float = 0.0
    intensity_max: float = 2.0
    # the Needle routes (/v1/needle/*): false answers a model not served by the first model, with a
    # warning (Needle's default); true refuses it, 404 model_not_found (NEEDLE_STRICT_MODEL)
    needle_strict_model: bool = False


attrs.resolve_types(Config)  # the fields' types, which the environment's values are parsed to


_converter = cattrs.Converter(forbid_extra_keys=True)  # a misplaced key is an error, not a no-op
_converter.register_structure_hook(str | list[str], lambda v, _: v if isinstance(v, str) else [str(x) for x in v])

# keys no variable sets: a table array, and the origins GREENROOM_ORIGINS / OLLAMA_ORIGINS add to (cors.py)
_NOT_FROM_ENV = frozenset({"models", "cors_origins"})
# names read after GREENROOM_<KEY>: Needle's, and the shorter name the request timeout had first
_ENV_ALIASES = {
    "api_key": ("NEEDLE_API_KEY",),
    "expose_extras": ("NEEDLE_EXPOSE_EXTRAS",),
    "request_timeout_s": ("GREENROOM_REQUEST_TIMEOUT", "NEEDLE_REQUEST_TIMEOUT"),
    "needle_strict_model": ("NEEDLE_STRICT_MODEL",),
    "max_loaded_models": ("OLLAMA_MAX_LOADED_MODELS",),
    "gguf_parallel": ("OLLAMA_NUM_PARALLEL",),
    "max_queue": ("OLLAMA_MAX_QUEUE",),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_names(key: str) -> tuple[str, ...]:
    """The variables that set `key`, the first one set winning: GREENROOM_<KEY>, then its aliases."""
    if key in _NOT_FROM_ENV:
        return ()
    return (f"GREENROOM_{key.upper()}", *_ENV_ALIASES.get(key, ()))


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None, **overrides) -> Config:
    """configs/default.toml; the file at `path` over it — its keys replace the defaults', its
    [[models]] entries change the default entries of their id or add models — or, when it says
    `defaults = false`, in place of it; then the environment's GREENROOM_<KEY> (`env`, default
    os.environ); then `overrides` (the CLI's flags). A ValueError says what is wrong and where."""
    raw = _read(DEFAULT_CONFIG)
    if path is not None:
        mine = _read(Path(path))
        layered = mine.pop("defaults", True)
        if not isinstance(layered, bool):
            raise ValueError(f"{path}: defaults is true (over configs/default.toml) or false, not {layered!r}")
        raw = _layered(raw, mine) if layered else mine
    raw.update(_from_env(os.environ if env is None else env))
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = _converter.structure(raw, Config)
    except cattrs.BaseValidationError as exc:
        raise ValueError("; ".join(cattrs.transform_error(exc, path="config"))) from None
    if config.fixed_shape not in ("auto", "on", "off"):
        raise ValueError(f"fixed_shape is auto, on or off, not {config.fixed_shape!r}")
    if config.prefix_cache_tokens is not None and config.prefix_cache_tokens < 0:
        raise ValueError(
            f"prefix_cache_tokens is a count of tokens (0: off; unset: from memory), not {config.prefix_cache_tokens}"
        )
    if config.max_loaded_models < 0:
        raise ValueError(f"max_loaded_models is a count (0: no limit), not {config.max_loaded_models}")
    budget_bytes(config)  # a bad size stops the start
    if config.gguf_cache_ram_mib is not None and config.gguf_cache_ram_mib < 0:
        raise ValueError(f"gguf_cache_ram_mib is a size in MiB (0: off), not {config.gguf_cache_ram_mib}")
    if config.max_blob_bytes < 1:
        raise ValueError(f"max_blob_bytes is a size in bytes (at least 1), not {config.max_blob_bytes}")
    for entry, model in zip(raw.get("models", []), config.models):
        if model.source is None:
            _check_found(model, entry, config.model_dirs)
        model.chat_template = _template_text(model)
    from greenroom.steering_rules import Limits  # checks them: a bad limit stops the start

    Limits(config.cluster_intensity_min, config.circuit_intensity_min, config.intensity_max)
    _check_workers(config)
    return config


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def budget_bytes(config: Config) -> int | None:
    """memory_budget in bytes: a number with an optional unit (800MB, 12GiB, 1.5gb); None: unset."""
    if config.memory_budget is None:
        return None
    text = config.memory_budget.strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = text[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        value = -1.0
    if not value > 0:
        raise ValueError(
            f"memory_budget is a size such as 12GiB, 800MB or a count of bytes, not {config.memory_budget!r}"
        )
    return int(value)


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None


def _layered(base: dict, mine: dict) -> dict:
    """`mine` over `base`: each key replaces base's; a [[models]] entry whose id base has changes
    that entry's keys (an id's n-th entry the n-th: replicas), any other is a model added."""
    out = {**base, **{k: v for k, v in mine.items() if k != "models"}}
    models = [dict(m) for m in base.get("models", [])]
    by_id = collections.defaultdict(list)
    for m in models:
        by_id[m.get("id")].append(m)
    entries = mine.get("models", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("models is an array of tables ([[models]] entries)")
    for entry in entries:
        same = by_id[entry.get("id")]
        if same:
            same.pop(0).update(entry)
        else:
            models.append(dict(entry))
    out["models"] = models
    return out


def _from_env(env: Mapping[str, str]) -> dict:
    """Every key a variable sets (an empty variable is unset), parsed to the key's type."""
    out = {}
    for field in attrs.fields(Config):
        for name in env_names(field.name):
            text = env.get(name, "").strip()
            if text:
                out[field.name] = _parsed(name, text, field.type)
                break
    return out


def _parsed(name: str, text: str, kind) -> object:
    """A variable's value as `kind` (bool, int, float, str, list[str], or one of those | None;
    a list is comma-separated); a value that is not one is a ValueError naming the variable."""
    kinds = set(typing.get_args(kind)) - {type(None)} if isinstance(kind, types.UnionType) else {kind}
    if list[str] in kinds and ("," in text or kinds == {list[str]}):
        return [part.strip() for part in text.split(",") if part.strip()]
    (kind,) = kinds - {list[str]}
    if kind is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{name}={text!r}: not a boolean (1, true, yes, on or 0, false, no, off)")
    if kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            raise ValueError(f"{name}={text!r}: not {'an integer' if kind is int else 'a number'}")
        return value
    return text


def _check_found(model: ModelConfig, entry: dict, model_dirs: list[str]) -> None:
    """An entry without a source configures a file model_dirs finds (the tree places it then)."""
    if not model_dirs:
        raise ValueError(
            f"model {model.id!r} has no source: give one, or name a GGUF model found below model_dirs (empty here)"
        )
    if entry.get("engine", "llama.cpp") != "llama.cpp":
        raise ValueError(
            f"model {model.id!r}: a file found below model_dirs is served by llama.cpp, not {model.engine}"
        )
    model.engine = "llama.cpp"


def _check_workers(config: Config) -> None:
    """A model on another host's actor needs workers_listen; workers_listen needs the token."""
    remote = [m.id for m in config.models if "/" in m.actor or (m.engine == "llama.cpp" and m.actor != "auto")]
    if config.workers_listen is None:
        if remote:
            raise ValueError(f"models {remote} are placed on worker hosts, but workers_listen is not set")
        return
    host, _, port = config.workers_listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"workers_listen must be ADDR:PORT, not {config.workers_listen!r}")
    from greenroom.hosts.tls import token_from_env

    token_from_env()  # raises TokenError saying what is missing


def _template_text(model: ModelConfig) -> str | None:
    """A model's `chat_template`: a file's text, or inline Jinja; anything else stops the start."""
    value = model.chat_template
    if value is None:
        return None
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"model {model.id!r}: chat_template is neither a Jinja template nor a file: {value!r}")
    return path.read_text()


def detect_engine_actors() -> list[str]:
    """gpu0…gpuN per CUDA card, else ["cpu"]. Reads the driver's view, not torch:
    the front-end process never imports torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        cards = [c for c in visible.split(",") if c.strip() and c.strip() != "-1"]
    else:
        gpus = Path("/proc/driver/nvidia/gpus")
        # sandboxed kernels (gVisor) may lack the /proc entry but still have the device nodes
        cards = (
            sorted(gpus.iterdir())
            if gpus.is_dir()
            else [d for d in Path("/dev").glob("nvidia*") if d.name[len("nvidia") :].isdigit()]
        )
    return [f"gpu{i}" for i in range(len(cards))] or ["cpu"]


def detect_npu_actors() -> list[str]:
    """npu0…npuN per NPU the kernel's accel driver lists (Intel's intel_vpu), else ["npu0"]:
    OpenVINO's NPU pipeline then runs on the CPU (NPUW_DEVICES=CPU), the same code path."""
    accel = sorted(Path("/dev/accel").glob("accel*")) if Path("/dev/accel").is_dir() else []
    return [f"npu{i}" for i in range(len(accel))] or ["npu0"]
