"""Scoring mode: the next-token distribution of a prompt, read in one forward pass — and, for
`echo`, the log-probability of every prompt token after the ones before it.

One implementation for every engine, in numpy float64 (the transformers engine hands over
its float32 rows, llama.cpp its logits buffer; the llama.cpp actor never imports torch):
a log-softmax over the real vocabulary (padded rows of the output matrix are not tokens),
optionally restricted to — and renormalised over — a set of allowed ids. The non-finite
rules are the spec's: NaN or +inf where they reach the answer is an error, −inf only where
it is reported.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .base import EngineError

# rows of a prompt's logits reduced at a time (float64 copies: 64 × 128k × 8 bytes = 64 MB at most)
_ROWS_AT_ONCE = 64


@attrs.frozen
class Scored:
    token_id: int  # the most probable (allowed) token
    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most probable first


@attrs.frozen
class PromptToken:
    """One prompt token (not the first) as the model predicted it from the tokens before it."""

    logprob: float
    top: list[tuple[int, float]]  # the `report` most probable there, most probable first


@attrs.frozen
class Echoed:
    """A prompt's log-probabilities (`echo`): `tokens[i]` is prompt token i + 1's; `next`, the
    position after the prompt scored as `score_row` scores it (None when not asked for)."""

    tokens: list[PromptToken]
    next: Scored | None


def score_row(logits, vocab: int, temperature: float, allowed: list[int] | None, report: int) -> Scored:
    """`logits`: the last position's row (any float array). The answer is the most probable
    candidate (every id, or the allowed ones, renormalised over them); `report`
    alternatives are returned with it, most probable first."""
    row = np.asarray(logits, dtype=np.float64)[:vocab]
    ids = None
    candidates = row
    if allowed is not None:
        bad = [t for t in allowed if not 0 <= t < vocab]
        if bad:
            raise EngineError(
                "invalid_scoring_request",
                f"allowed_token_ids outside the vocabulary (0–{vocab - 1}): {bad[:5]}",
                "allowed_token_ids",
            )
        ids = np.array(sorted(set(allowed)), dtype=np.int64)
        candidates = row[ids]
    # NaN or +inf where they reach the answer is an error; -inf only if reported
    if np.isnan(candidates).any() or np.isposinf(candidates).any():
        raise EngineError(
            "non_finite_logits",
            "the model produced NaN or +inf logits "
            + ("on an allowed token" if allowed is not None else "at the scored position"),
        )
    if temperature > 0:
        candidates = candidates / temperature
    logprobs = candidates - _logsumexp(candidates[None, :])[0]
    order = _top(logprobs[None, :], min(max(report, 1), len(candidates)))[0]
    chosen = order if ids is None else ids[order]
    top = [(int(i), float(logprobs[j])) for i, j in zip(chosen, order)]
    if any(not math.isfinite(lp) for _, lp in top[: max(report, 1)]):
        raise EngineError("non_finite_logits", "a reported token has a logit of -inf")
    return Scored(top[0][0], top[0][1], top[:report])


def prompt_tokens(
    rows, targets: list[int], vocab: int, temperature: float, report: int, first: int = 1
) -> list[PromptToken]:
    """`rows[i]`: the logits after prompt position i, which predict `targets[i]` (the prompt's
    next token); over the whole vocabulary, `temperature` dividing the logits as in
    `score_row`. `first`: the prompt position of targets[0], for the messages."""
    rows = np.asarray(rows)
    out: list[PromptToken] = []
    for start in range(0, len(targets), _ROWS_AT_ONCE):
        x = rows[start : start + _ROWS_AT_ONCE, :vocab].astype(np.float64)
        want = np.asarray(targets[start : start + _ROWS_AT_ONCE], dtype=np.int64)
        outside = want[(want < 0) | (want >= vocab)]
        if outside.size:
            raise EngineError(
                "invalid_scoring_request",
                f"prompt token {int(outside[0])} is not one of the "
                f"{vocab} tokens the model predicts: its log-probability does not exist",
                "prompt",
            )
        broken = np.isnan(x).any(axis=1) | np.isposinf(x).any(axis=1)
        if broken.any():
            at = first + start + int(np.argmax(broken))
            raise EngineError(
                "non_finite_logits", f"the model produced NaN or +inf logits predicting prompt token {at}", "echo"
            )
        if temperature > 0:
            x /= temperature
        x -= _logsumexp(x)[:, None]  # log-probabilities, in place
        chosen = x[np.arange(len(want)), want]
        order = _top(x, min(report, vocab)) if report > 0 else np.zeros((len(want), 0), dtype=np.int64)
        values = np.take_along_axis(x, order, axis=1)
        if not np.isfinite(chosen).all() or not np.isfinite(values).all():
            row = int(np.argmin(np.isfinite(chosen) & np.isfinite(values).all(axis=1)))
            raise EngineError(
                "non_finite_logits",
                f"a reported token has a logit of -inf (predicting prompt token {first + start + row})",
                "echo",
            )
        for lp, ids, vals in zip(chosen.tolist(), order.tolist(), values.tolist()):
            out.append(PromptToken(lp, list(zip(ids, vals))))
    return out


def _logsumexp(x: np.ndarray) -> np.ndarray:
    """Per row; a row whose every entry is -inf sums to -inf."""
    top = x.max(axis=1)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(x - safe[:, None]).sum(axis=1))


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's k largest entries, largest first (ties: the lower id first)."""
    if k >= x.shape[1]:
        part = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    else:
        part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(x, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, axis=1)[:, :k]
