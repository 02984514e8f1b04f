"""The default bound of a model's prefix-reuse store, one rule for both engines — the
transformers prefix tree (transformers/prefix_cache.py) and llama.cpp's RAM prompt store
(llama_cpp/prompt_store.py): a quarter of the memory the model's device has available when it
loads and, in host memory, at most 8 GiB (llama-server's `--cache-ram` default). A card's free
memory is not capped: there the store is what the card is for."""

from __future__ import annotations

import psutil

SHARE = 1 / 4
HOST_MAX = 8 * 2**30


def available_memory(device: str = "cpu") -> int:
    """Bytes free on `device` now: a card's free memory, or the host's available memory."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def reuse_bytes(available: int | None = None, host: bool = True) -> int:
    """The bound for `available` bytes free (the host's available memory now, by default)."""
    if available is None:
        available = available_memory()
    share = int(available * SHARE)
    return min(HOST_MAX, share) if host else share
