"""Next-token sampling with a per-request generator, so a seeded request's draws never
depend on other requests (transformers' `generate` has no per-request generator)."""

from __future__ import annotations

import torch

from ..base import GREEDY_BELOW, SamplingParams


def new_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def token_logprob(logits: torch.Tensor, token: int, top: int | None = None) -> tuple[float, tuple]:
    """The model's own log-probability of `token` (temperature 1, after any constraint
    mask): what confidence figures are computed from; and the `top` most probable (id,
    log-probability) pairs (() for None or 0)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if not top:
        return float(logprobs[token]), ()
    values, ids = logprobs.topk(min(top, logprobs.shape[-1]))
    return float(logprobs[token]), tuple(zip(ids.tolist(), values.tolist()))


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator, seen: torch.Tensor) -> int:
    """`logits`: the last position's [vocab] row; `seen`: the token ids so far."""
    logits = logits.float()
    if params.repetition_penalty != 1.0 and len(seen):
        # HF's rule: a seen token's positive logit is divided by the penalty, a negative one multiplied
        scores = logits.gather(0, seen)
        scores = torch.where(scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty)
        logits = logits.scatter(0, seen, scores)
    return int(sample_rows(logits[None], params, gen)[0])


def sample_rows(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    """One token per row of `logits` [rows, vocab], every row under the same temperature,
    top_k and top_p (no penalty: it depends on each row's history)."""
    logits = logits.float()
    if params.temperature < GREEDY_BELOW or params.top_k == 1:
        return torch.argmax(logits, dim=-1)
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # shifted so the largest is 0: a tiny temperature then sends the others to -inf, not inf/inf
    probs = torch.softmax((logits - logits.amax(dim=-1, keepdim=True)) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
        cum = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest prefix whose mass reaches top_p, and always the most probable token
        drop = (cum - sorted_probs) >= params.top_p
        drop[:, 0] = False
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]
