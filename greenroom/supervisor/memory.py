"""Whether a model can load, decided before any weight moves: its quantization is one this
server can load, and its weights and cache fit the memory its actor's device has free."""

from __future__ import annotations

import importlib.util

import psutil

from greenroom.engines.llama_cpp import gguf_meta
from greenroom.engines.loader import checkpoint_json
from greenroom.errors import GreenroomError
from greenroom.supervisor.placements import Placement
from greenroom.supervisor.slots import ActorSlot

# transformers quantization methods, by the package that must be installed to load them
QUANTIZATION_PACKAGES = {
    "bitsandbytes": "bitsandbytes",
    "gptq": "gptqmodel",
    "awq": "awq",
    "hqq": "hqq",
    "quanto": "optimum.quanto",
    "fp8": "torch",
    "compressed-tensors": "compressed_tensors",
}


def check_quantization(p: Placement) -> None:
    """Refuse a checkpoint whose quantization this server cannot load (400
    unsupported_quantization): an unknown method, or one whose package is absent."""
    quant = checkpoint_json(p.path()).get("quantization_config")
    if not isinstance(quant, dict):
        return
    method = str(quant.get("quant_method", "unknown"))
    package = QUANTIZATION_PACKAGES.get(method)
    if package is None or importlib.util.find_spec(package.split(".")[0]) is None:
        raise GreenroomError(
            "unsupported_quantization",
            f"model {p.id!r} is quantized with {method!r}, which this "
            "server cannot load" + (f" (install {package})" if package else ""),
            "model",
        )


def check_fit(p: Placement, actor: str, memory: dict | None) -> None:
    """Refuse a load that cannot fit `actor`'s device (503 insufficient_memory, with the
    figures); `memory`: what the device has free (`free_memory`), None when unknown."""
    need = checkpoint_bytes(p)
    if need is None or memory is None or need <= memory["free_bytes"]:
        return
    gib = 2**30
    raise GreenroomError(
        "insufficient_memory",
        (
            f"model {p.id!r} needs about {need / gib:.1f} GiB; {actor} ({memory['device']}) has "
            f"{memory['free_bytes'] / gib:.1f} GiB free of {memory['total_bytes'] / gib:.1f} GiB"
        ),
        "model",
    )


def checkpoint_bytes(p: Placement) -> int | None:
    """About what a checkpoint takes once loaded: a GGUF file's size and its generation
    context — `parallel` sequences of `n_ctx` KV cells and a ubatch's logits, read from its
    header (gguf_meta.load_bytes; what the llama.cpp engine reports after loading, within
    a header's size) —, else its weight files' size, halved when a float32 checkpoint is loaded
    in bfloat16 (on CUDA). None when it is not on disk yet (a demo model is built at its
    first load)."""
    path = p.path()
    if path.suffix == ".gguf" or p.engine == "llama.cpp":  # an uploaded GGUF file has no suffix
        if not path.is_file():
            return None
        size = path.stat().st_size
        try:
            return gguf_meta.load_bytes(gguf_meta.read(path), size, p.n_ctx, p.parallel or 1)
        except gguf_meta.GGUFError:  # not a GGUF file: the load will say so
            return size
    files = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    if not files:
        return None
    size = sum(f.stat().st_size for f in files)
    config = checkpoint_json(path)
    stored = str(config.get("dtype") or config.get("torch_dtype") or "")
    halved = p.device.startswith("cuda") and stored == "float32" and not p.dtype
    return size // 2 if halved else size


async def free_memory(slot: ActorSlot) -> dict | None:
    """{"device", "free_bytes", "total_bytes"} of the device `slot`'s actor loads on: the host's
    for an on-demand (llama.cpp) actor, which is not running yet; else what the engine actor
    reports in its status (torch.cuda.mem_get_info on a card, available host memory on cpu).
    None when it does not answer."""
    if slot.on_demand:
        vm = psutil.virtual_memory()
        return {"device": "cpu", "free_bytes": vm.available, "total_bytes": vm.total}
    client = slot.client
    return (await client.status() or {}).get("memory") if client is not None else None
