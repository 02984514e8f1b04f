"""Ollama's rule for a prompt longer than its context window, which Ollama answers instead
of refusing (the Ollama surface follows it; /v1 refuses with context_length_exceeded):

1. messages (server/prompt.go, chatPrompt): the last message is always kept; older ones are
   kept from the newest back for as long as the rendering fits, so the oldest go first —
   but a system message before the cut is kept too;
2. tokens (the runner's NewSequence): a prompt still too long keeps its first `keep` tokens
   (options.num_keep, 4 by default) and its last ones, dropping the middle.

Ollama compares the prompt alone with num_ctx and then shifts its cache while generating;
greenroom's engines do not shift, so the prompt is fitted into what leaves the answer room
(`target`) and the answer stops at the window. Pure: rendering is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.frozen
class Truncated:
    """What a fit cut: the oldest messages dropped, the prompt tokens dropped from its middle."""

    messages: int
    tokens: int


@attrs.frozen
class Fitted:
    ids: list[int]
    messages: int = 0  # oldest messages dropped
    tokens: int = 0  # tokens dropped from the middle

    @property
    def truncated(self) -> Truncated | None:
        return Truncated(self.messages, self.tokens) if self.messages or self.tokens else None


def fit_conversation(render: Callable[[list[dict]], list[int]], messages: list[dict], target: int, keep: int) -> Fitted:
    """`render(messages)` → prompt ids; the prompt fitted into `target` tokens."""
    ids = render(messages)
    if len(ids) <= target:
        return Fitted(ids)
    last, cut = len(messages) - 1, len(messages) - 1
    for i in range(last - 1, -1, -1):
        candidate = render(_kept(messages, i))
        if len(candidate) > target:
            break
        ids, cut = candidate, i
    if cut == last:
        ids = render(_kept(messages, last))
    dropped = sum(1 for m in messages[:cut] if m.get("role") != "system")
    fitted = fit_ids(ids, target, keep)
    return Fitted(fitted.ids, dropped, fitted.tokens)


def fit_ids(ids: list[int], target: int, keep: int) -> Fitted:
    """The first `keep` tokens and the last ones, `target` in all (at least one of the last)."""
    if len(ids) <= target:
        return Fitted(ids)
    keep = max(0, min(keep, target - 1))
    tail = target - keep
    return Fitted(ids[:keep] + ids[len(ids) - tail :], tokens=len(ids) - target)


def _kept(messages: list[dict], cut: int) -> list[dict]:
    return [m for m in messages[:cut] if m.get("role") == "system"] + messages[cut:]


def answer_room(window: int, answer: int) -> int:
    """Tokens the fitted prompt leaves for the answer: num_predict, at most half the window."""
    return max(1, min(answer, window // 2))
