"""Scoring mode: the next-token distribution of a prompt, read in one forward pass.

Float32 log-softmax over the real vocabulary (padded rows of the output matrix are
not tokens), optionally restricted to — and renormalised over — a set of allowed ids.
"""

from __future__ import annotations

import math

import attrs
import torch

from .base import EngineError


@attrs.frozen
class Scored:
    token_id: int  # the most probable (allowed) token
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most probable first


def score_logits(logits: torch.Tensor, vocab: int, temperature: float, allowed: list[int] | None,
                 report: int) -> Scored:
    """`logits`: the last position's row. The answer is the most probable candidate
    (every id, or the allowed ones, renormalised over them); `report` alternatives are
    returned with it, most probable first."""
    logits = logits[:vocab].float()
    ids = None
    candidates = logits
    if allowed is not None:
        bad = [t for t in allowed if not 0 <= t < vocab]
        if bad:
            raise EngineError("invalid_scoring_request", f"allowed_token_ids outside the vocabulary "
                              f"(0–{vocab - 1}): {bad[:5]}", "allowed_token_ids")
        ids = torch.tensor(sorted(set(allowed)), dtype=torch.long)
        candidates = logits[ids]
    # NaN or +inf where they reach the answer is an error; -inf only if reported
    if torch.isnan(candidates).any() or torch.isposinf(candidates).any():
        raise EngineError("non_finite_logits", "the model produced NaN or +inf logits "
                          + ("on an allowed token" if allowed is not None else "at the scored position"))
    if temperature > 0:
        candidates = candidates / temperature
    logprobs = torch.log_softmax(candidates, dim=-1)
    values, order = torch.topk(logprobs, min(max(report, 1), len(candidates)))
    chosen = order if ids is None else ids[order]
    top = [(int(i), float(v)) for i, v in zip(chosen, values)]
    if any(not math.isfinite(lp) for _, lp in top[: max(report, 1)]):
        raise EngineError("non_finite_logits", "a reported token has a logit of -inf")
    return Scored(top[0][0], top[0][1], top[:report])
