"""Embeddings in padded batches, on the transformers engine's models alike (an encoder's, and a
causal LM's mean-pooled rule): inputs sorted by length (so a batch pads little), cut where a
batch would pass BATCH_TOKENS padded positions, each batch one forward pass with its attention
mask, right-padded — a causal LM's tokens never attend to the padding after them, and keep
their positions — and pooled over the unpadded positions only."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..text.pooling import Pooling

# padded positions one forward pass takes at most: 128 inputs of ~40 tokens run as one batch;
# inputs at all-MiniLM's 256-token window run 32 at a time (~100 MB of attention scores in float32)
BATCH_TOKENS = 8192


def embed_batched(
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: list[list[int]],
    pooling: Pooling,
    pad_id: int,
    device: torch.device,
) -> list[list[float]]:
    """One pooled vector per tokenised input, in the inputs' order; `forward(ids, mask)` gives
    a batch's last hidden states (rows × positions × width)."""
    out: list[list[float] | None] = [None] * len(inputs)
    for batch in batches([len(ids) for ids in inputs], BATCH_TOKENS):
        width = max(len(inputs[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(inputs[i])] = torch.tensor(inputs[i])
            mask[row, : len(inputs[i])] = 1
        ids, mask = ids.to(device), mask.to(device)
        for i, vector in zip(batch, pool(forward(ids, mask), mask, pooling).tolist(), strict=True):
            out[i] = vector
    return out


def batches(lengths: list[int], budget: int) -> list[list[int]]:
    """The inputs' indices in batches, shortest first: each batch as many as fit in `budget`
    padded positions (its count × its longest), at least one."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[i] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """One float32 vector per row of `hidden` (rows × positions × width, right-padded), pooled
    over the positions `mask` (rows × positions, 1 for a token) marks, as sentence-transformers'
    Pooling module pools them; unit length when the checkpoint has a Normalize module."""
    hidden, keep = hidden.float(), mask.unsqueeze(-1).float()
    if pooling.mode == "cls":
        vectors = hidden[:, 0]
    elif pooling.mode == "max":
        vectors = hidden.masked_fill(keep == 0, float("-inf")).max(dim=1).values
    elif pooling.mode == "lasttoken":
        vectors = hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
    else:
        vectors = (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(vectors, p=2, dim=1) if pooling.normalize else vectors
