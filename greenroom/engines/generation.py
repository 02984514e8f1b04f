"""Token ids → text deltas with finish reasons, the same for every engine and for both
the serial path (`generate`) and the continuous batch (`batching.py`): one `Decoder`
per sequence, fed one token per decode step."""

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
    sae_activations: list | None = None  # on the last Delta of a sequence read out: Readout.result
    monitor: dict | None = None  # on the last Delta of a monitored sequence: Monitor.result


class Decoder:
    """One sequence's ids → Deltas: incremental detokenisation, the stop matcher, EOS,
    a grammar's completion and max_tokens. The last Delta carries finish_reason; a
    grammar's document completed is a "stop" too, also on the max_tokens-th token."""

    def __init__(self, engine: Engine, params: SamplingParams, matcher=None):
        self._detok = IncrementalDetokenizer(engine.decode)
        self._stops = StopMatcher(params.stop)
        self._eos = engine.eos_token_ids
        self._max_tokens = params.max_tokens
        self.matcher = matcher
        self.n = 0

    def empty(self) -> Delta | None:
        """The whole answer when no token is asked for: nothing need run."""
        return Delta("", 0, "length") if self._max_tokens <= 0 else None

    def feed(self, token_id: int, logprob: float) -> Delta:
        self.n += 1
        detok, stops, n = self._detok, self._stops, self.n
        if token_id in self._eos:
            return Delta(stops.feed(detok.flush()) + stops.flush(), n, "stop", logprob)
        text = stops.feed(detok.add(token_id))
        if stops.matched is not None:
            return Delta(text, n, "stop", logprob)
        if self.matcher is not None and self.matcher.done():
            return Delta(text + self._tail(), n, "stop", logprob)
        if n >= self._max_tokens:
            return Delta(text + self._tail(), n, stops.matched and "stop" or "length", logprob)
        return Delta(text, n, logprob=logprob)

    def _tail(self) -> str:
        text = self._stops.feed(self._detok.flush())
        return text if self._stops.matched is not None else text + self._stops.flush()


def generate(engine: Engine, prompt_ids: list[int], params: SamplingParams, grammar=None,
             readout=None, monitor=None) -> Iterator[Delta]:
    """The serial path: one Delta per decode step (text may be empty while a character or
    a possible stop string is incomplete); the last one carries finish_reason, and with a
    `readout` (steering.Readout) the activations read, with a `monitor` (steering.Monitor)
    its record — transformers only."""
    decoder = Decoder(engine, params, engine.matcher(grammar) if grammar is not None else None)

    def last(delta: Delta) -> Delta:
        return attrs.evolve(delta, sae_activations=None if readout is None else readout.result(fed),
                            monitor=None if monitor is None else monitor.result())

    fed = list(prompt_ids)  # the token at each position read
    done = decoder.empty()
    if done is not None:
        yield last(done)
        return
    # only the engines with SAE hooks take observers
    observers = {k: v for k, v in (("readout", readout), ("monitor", monitor)) if v is not None}
    ids = engine.generate_ids(prompt_ids, params, decoder.matcher, **observers)
    try:
        for token_id, logprob in ids:
            delta = decoder.feed(token_id, logprob)
            if delta.finish_reason:
                delta = last(delta)
            fed.append(token_id)
            yield delta
            if delta.finish_reason:
                return
    finally:
        ids.close()
