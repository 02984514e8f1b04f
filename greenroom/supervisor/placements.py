"""What is placed where: a model's placement on an actor, its lifecycle state there, and
the table of every placed model that the tree's parts share (the lifecycle changes the
states; nobody else does)."""

from __future__ import annotations

import enum
from pathlib import Path

import attrs
import trio

from greenroom.engines.base import ModelInfo
from greenroom.engines.capabilities import EMBEDDING_MODEL, Capabilities, capabilities_of, common
from greenroom.engines.embedding_models import embedding_only
from greenroom.engines.loader import source_path
from greenroom.errors import GreenroomError
from greenroom.supervisor.slots import ActorSlot


@attrs.frozen
class Placement:
    """One model on one actor: what its engine loads and how. Fixed once placed (a created
    model made again is placed anew)."""

    id: str  # the served model id
    source: str  # demo:<size>, demo-gguf:<QUANT>, package:…, gguf-converted:…, gguf-from:…, unpacked:…, a directory or a .gguf file
    engine: str  # transformers | llama.cpp | openvino (engines/capabilities.py)
    device: str  # where the engine runs it: cpu, cuda:N, npu:N
    dtype: str | None = None  # the loaded weights' dtype; None: the engine's default for the device
    cache_dir: str | None = None  # the cache root demo builds and conversions go to; None: the default
    chat_template: str | None = None  # the config's, over the model's own: Jinja text or a file's path
    n_ctx: int | None = None  # llama.cpp: its context window (0: the model's trained one)
    threads: int | None = None  # llama.cpp: decode threads (None: all cores but one)
    parallel: int | None = None  # llama.cpp: sequences decoded together
    cache_ram: int | None = None  # llama.cpp: bytes of prompt states kept in RAM (None: from memory; 0: off)
    prefix_cache_tokens: int | None = None  # transformers: KV tokens kept for prefix reuse (None: from memory)
    fixed_shape: str | None = None  # transformers: the fixed-shape decode step, auto | on | off
    fixed_shape_slots: int | None = None  # … its batch's slots
    fixed_shape_length: int | None = None  # … and tokens per slot
    # a model made by /api/create: its system, template, parameters, messages (http/ollama/ollama_defaults.py),
    # and what /api/show says of it besides: license, parent_model
    defaults: dict | None = None

    def path(self) -> Path:
        """Where its checkpoint or file is, or will be once built (builds nothing)."""
        return source_path(self.source, self.cache_dir)

    def embedding_model(self) -> bool:
        """Whether it is an embedding model (engines/embedding_models.py; its files read once)."""
        return embedding_only(self.source, self.cache_dir)

    def capabilities(self) -> Capabilities:
        """What it honours: its engine's, or an embedding model's."""
        return EMBEDDING_MODEL if self.embedding_model() else capabilities_of(self.engine)

    def to_spec(self) -> dict:
        """The placement as it crosses to another process (protocol.Load, the engine session's
        models, the steering coordinator's attach check): the dict engines/loader.load_engine
        reads. The defaults stay here: only the front end applies them."""
        return attrs.asdict(self, filter=attrs.filters.exclude(attrs.fields(Placement).defaults))


class LoadState(enum.StrEnum):
    """A placed model's state on its actor, as /api/models shows it (the values are the wire's)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"


@attrs.define(eq=False)
class ModelState:
    """One placed model's lifecycle on its actor: loaded ⇄ unloaded, through loading /
    unloading (lifecycle.py makes every transition). `changed` is set when a transition ends."""

    slot: ActorSlot
    placement: Placement
    preload: bool  # loaded as its actor starts
    state: LoadState = LoadState.UNLOADED
    # while loading: the long stage the engine reports it in ("converting": protocol.Loading), shown
    # as the model's state; None otherwise
    stage: str | None = None
    info: ModelInfo | None = None  # while loaded
    changed: trio.Event = attrs.Factory(trio.Event)
    expires_at: float | None = None  # keep_alive: unload at this trio time
    timer: bool = False  # a keep-alive timer task is watching expires_at
    keep_alive_s: float = 0.0  # the idle time expires_at was last set from
    moved: trio.Event = attrs.Factory(trio.Event)  # wakes the timer when expires_at changes
    last_used: float = float("-inf")  # trio time a request last asked for it: the least recent makes room first
    pinned: bool = False  # its last keep_alive was negative: never unloaded when idle (eviction.py)
    # chosen to make room while requests ran on it: set once it is unloaded; requests for it wait till then
    draining: trio.Event | None = None
    holds_room: bool = False  # loading, past the room check: its memory counts as taken (eviction.py)
    # actor = "auto": the placement as configured, on this host; each load moves it to the actor
    # chosen then, on any host (Lifecycle._place); None: placed on `slot` for good
    auto: Placement | None = None

    @property
    def id(self) -> str:
        return self.placement.id

    @property
    def shown(self) -> str:
        """The state as the views show it: a loading model's stage, if it is in one."""
        return self.stage if self.state == LoadState.LOADING and self.stage else self.state


class ModelTable:
    """Every placed model: each id's placements (replicas), the preferred — the first
    configured — first."""

    def __init__(self) -> None:
        self.replicas: dict[str, list[ModelState]] = {}

    def add(self, m: ModelState) -> None:
        self.replicas.setdefault(m.id, []).append(m)

    def remove(self, model: str) -> list[ModelState]:
        return self.replicas.pop(model)

    def preferred(self) -> dict[str, ModelState]:
        return {model: ms[0] for model, ms in self.replicas.items()}

    def on(self, slot: ActorSlot) -> list[ModelState]:
        """The placements on one actor."""
        return [m for ms in self.replicas.values() for m in ms if m.slot is slot]

    def state_of(self, model: str) -> ModelState:
        """`model`'s preferred placement, or 404 model_not_found."""
        return self.replicas_of(model)[0]

    def replicas_of(self, model: str) -> list[ModelState]:
        ms = self.replicas.get(model)
        if ms is None:
            raise GreenroomError("model_not_found", f"The model '{model}' does not exist", "model")
        return ms

    def resolve(self, name: str) -> str:
        """The served id for a request's model name: the id itself, or a bare GGUF
        repository name while only one quantization of it is served (else 400
        AMBIGUOUS_MODEL_NAME naming the tags; 404 when nothing matches)."""
        if name in self.replicas:
            return name
        tags = [
            model
            for model, ms in self.replicas.items()
            if ms[0].placement.engine == "llama.cpp" and model.rpartition(":")[0] == name
        ]
        if len(tags) == 1:
            return tags[0]
        if tags:
            raise GreenroomError(
                "AMBIGUOUS_MODEL_NAME",
                f"model {name!r} names several quantizations: {', '.join(tags)}; name one of them",
                "model",
            )
        raise GreenroomError("model_not_found", f"The model '{name}' does not exist", "model")

    def capabilities(self, model: str) -> tuple[str, Capabilities]:
        """The engine(s) `model` is placed on (`a/b` for several) and what all of them honour
        (an embedding model's: what an embedding model has)."""
        replicas = self.replicas_of(model)
        engines = tuple(dict.fromkeys(m.placement.engine for m in replicas))
        if any(m.placement.embedding_model() for m in replicas):
            return "/".join(engines), EMBEDDING_MODEL
        return "/".join(engines), common(engines)


def placed_on(p: Placement, slot: ActorSlot) -> Placement:
    """An auto placement `p` (as configured on this host) moved to `slot`'s actor: the device
    there, and a worker host's own cache for what it builds."""
    return attrs.evolve(p, device=device_of(slot.name), cache_dir=p.cache_dir if slot.host is None else None)


def device_of(actor: str) -> str:
    """gpuN → cuda:N, npuN → npu:N (OpenVINO's NPU pipeline), anything else → cpu; a worker
    host's actor (`hostb/gpu0`) by its own name there."""
    actor = actor.rpartition("/")[2]
    for prefix, device in (("gpu", "cuda"), ("npu", "npu")):
        if actor.startswith(prefix) and actor[len(prefix) :].isdigit():
            return f"{device}:{actor[len(prefix) :]}"
    return "cpu"
