"""Configuration: configs/*.toml, then GREENROOM_* environment variables, then CLI flags."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import attrs
import cattrs

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.toml"


@attrs.define
class ModelConfig:
    id: str
    source: str  # "demo:<size>", "demo-gguf:<QUANT>", a checkpoint directory or a .gguf file
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
    gguf_n_ctx: int = 4096  # llama.cpp context window, capped at the model's trained context
    gguf_threads: int = 0  # llama.cpp decode threads; 0: all cores but one
    gguf_parallel: int = 4  # llama.cpp sequences decoded together per model (each its own n_ctx of cache)
    # an engine actor computing on one thread gets a CPU of its own, when one is free (cpus.py)
    pin_cpus: bool = True
    cache_dir: str | None = None  # cache root (models/ below it); default $GREENROOM_CACHE or ~/.cache/greenroom
    restart_limit: int = 5  # restarts allowed within restart_window_s before an actor is left failed
    restart_window_s: float = 300.0
    ready_timeout_s: float = 120.0  # how long a request waits for its actor to (re)start
    expose_extras: bool = True  # the x_needle block on chat completions (--no-extras)
    api_key: str | None = None  # every route but /health and / then needs "Authorization: Bearer <key>"
    # browser origins allowed besides Ollama's defaults (localhost, 127.0.0.1, app://, …), `*` wildcards;
    # OLLAMA_ORIGINS and GREENROOM_ORIGINS add more (http/cors.py)
    cors_origins: list[str] = attrs.Factory(list)
    request_timeout_s: float | None = None  # past it, a request not yet answering is a 504 (and cancelled)
    idle_unload_s: float = 0.0  # unload a model idle this long (0: never); Ollama's keep_alive overrides it
    graceful_unload_timeout_s: float = 30.0  # GRACEFUL_UNLOAD_TIMEOUT: running requests' grace before an unload
    # SIGTERM/SIGINT: how long running requests may finish (new ones get 503) before what is left
    # ends with server_shutting_down (http/shutdown.py); within docker stop's 10 s with the teardown
    graceful_shutdown_timeout_s: float = 5.0
    continuous_batching: bool = False  # batch requests with the fixed sampling parameters (engine_actor.py)
    # streamed chunks a second the front end sends in all before it holds each stream's tokens to
    # fewer, larger chunks (http/pacing.py); 0: one chunk per engine event, whatever the load
    stream_chunks_per_s: float = 2000.0
    # transformers: KV tokens of prompts kept per model for automatic prefix reuse (engines/prefix_cache.py); 0: off
    prefix_cache_tokens: int = 8192
    # transformers: decode in fixed shapes (engines/fixed_shape.py), compiled on CUDA: "auto" (on CUDA), "on", "off";
    # a continuous batch holds fixed_shape_slots sequences, each of up to fixed_shape_length tokens (longer: eager)
    fixed_shape: str = "auto"
    fixed_shape_slots: int = 64
    fixed_shape_length: int = 2048
    # "ADDR:PORT" where worker hosts join (`greenroom worker --join`), over TLS keyed by
    # GREENROOM_WORKER_TOKEN (set on both hosts); unset: no worker can join
    workers_listen: str | None = None
    worker_timeout_s: float = 5.0  # a worker link silent this long is a lost host
    # steering_intensity (actors/steering_rules.py): CLUSTER_INTENSITY_MIN, CIRCUIT_INTENSITY_MIN and
    # the server's maximum dial, all within [0, 2]
    cluster_intensity_min: float = 0.5
    circuit_intensity_min: float = 0.0
    intensity_max: float = 2.0


_converter = cattrs.Converter(forbid_extra_keys=True)  # a misplaced key is an error, not a no-op
_converter.register_structure_hook(str | list[str], lambda v, _: v if isinstance(v, str) else [str(x) for x in v])


def _on(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


_ENV_FIELDS = {
    "host": str,
    "port": int,
    "ollama_port": int,
    "log_level": str,
    "default_max_tokens": int,
    "max_queue": int,
    "continuous_batching": _on,
    "prefix_cache_tokens": int,
    "fixed_shape": str,
}


def load_config(path: str | Path | None = None, **overrides) -> Config:
    raw = tomllib.loads(Path(path or DEFAULT_CONFIG).read_text())
    for name, cast in _ENV_FIELDS.items():
        value = os.environ.get(f"GREENROOM_{name.upper()}")
        if value is not None:
            raw[name] = cast(value)
    timeout = os.environ.get("GREENROOM_REQUEST_TIMEOUT") or os.environ.get("NEEDLE_REQUEST_TIMEOUT")
    if timeout:
        raw["request_timeout_s"] = float(timeout)
    key = os.environ.get("GREENROOM_API_KEY") or os.environ.get("NEEDLE_API_KEY")  # Needle's name too
    if key:
        raw["api_key"] = key
    extras = os.environ.get("GREENROOM_EXPOSE_EXTRAS", os.environ.get("NEEDLE_EXPOSE_EXTRAS"))
    if extras is not None:
        raw["expose_extras"] = extras.strip().lower() not in ("0", "false", "no", "off")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    config = _converter.structure(raw, Config)
    if config.fixed_shape not in ("auto", "on", "off"):
        raise ValueError(f"fixed_shape is auto, on or off, not {config.fixed_shape!r}")
    for model in config.models:
        model.chat_template = _template_text(model)
    from greenroom.actors.steering_rules import Limits  # checks them: a bad limit stops the start

    Limits(config.cluster_intensity_min, config.circuit_intensity_min, config.intensity_max)
    _check_workers(config)
    return config


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
