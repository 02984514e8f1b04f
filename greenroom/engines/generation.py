"""Token ids → text deltas with finish reasons, the same for every engine."""

from __future__ import annotations

from typing import Iterator

import attrs

from .base import Engine, SamplingParams
from .detokenize import IncrementalDetokenizer
from .stops import StopMatcher


@attrs.frozen
class Delta:
    text: str
    completion_tokens: int
    finish_reason: str | None = None  # "stop" (EOS or stop string) | "length"
    logprob: float = 0.0  # of this step's token


def generate(engine: Engine, prompt_ids: list[int], params: SamplingParams, grammar=None) -> Iterator[Delta]:
    """One Delta per decode step (text may be empty while a character or a possible
    stop string is incomplete); the last one carries finish_reason. A grammar's document
    completed is a "stop" too, also when it completes on the max_tokens-th token."""
    detok = IncrementalDetokenizer(engine.decode)
    stops = StopMatcher(params.stop)
    matcher = engine.matcher(grammar) if grammar is not None else None
    ids = engine.generate_ids(prompt_ids, params, matcher)
    n = 0
    try:
        if params.max_tokens <= 0:
            yield Delta("", 0, "length")
            return
        for token_id, logprob in ids:
            n += 1
            if token_id in engine.eos_token_ids:
                yield Delta(stops.feed(detok.flush()) + stops.flush(), n, "stop", logprob)
                return
            text = stops.feed(detok.add(token_id))
            if stops.matched is not None:
                yield Delta(text, n, "stop", logprob)
                return
            if matcher is not None and matcher.done():
                yield Delta(text + _tail(detok, stops), n, "stop", logprob)
                return
            if n >= params.max_tokens:
                yield Delta(text + _tail(detok, stops), n, stops.matched and "stop" or "length", logprob)
                return
            yield Delta(text, n, logprob=logprob)
    finally:
        ids.close()


def _tail(detok: IncrementalDetokenizer, stops: StopMatcher) -> str:
    text = stops.feed(detok.flush())
    return text if stops.matched is not None else text + stops.flush()
