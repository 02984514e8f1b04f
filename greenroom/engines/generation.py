"""Token ids → text deltas with finish reasons, the same for every engine and for both
the serial path (`generate`) and the continuous batch (`batching.py`): one `Decoder`
per sequence, fed one token per decode step."""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs

from .base import Activations, Engine, EngineError, MonitorRecord, SamplingParams
from .text.detokenize import IncrementalDetokenizer
from .text.stops import StopMatcher
from .text.tool_calls import CallGuard


@attrs.frozen
class Delta:
    text: str
    completion_tokens: int
    finish_reason: str | None = None  # "stop" (EOS, a stop string, the grammar's end, a repeated call) | "length"
    logprob: float = 0.0  # of this step's token
    sae_activations: Activations | None = None  # on the last Delta of a sequence read out: Readout.result
    monitor: MonitorRecord | None = None  # on the last Delta of a monitored sequence: Monitor.result
    stop: str | None = None  # on the last Delta: the stop string that ended it (vLLM's stop_reason)
    # with params.logprobs: this step's token — (its id, its text, its log-probability, ((id, text,
    # log-probability) of each of the most probable at its position, …)) — None for an end of generation
    token: tuple | None = None


class Decoder:
    """One sequence's ids → Deltas: incremental detokenisation, the stop matcher, EOS,
    a grammar's completion and max_tokens. The last Delta carries finish_reason; a
    grammar's document completed is a "stop" too, also on the max_tokens-th token.

    With a `guard` (a constrained tool-call answer, tool_calls.CallGuard) each call's text
    is held until its block closes: a call that repeats an earlier one exactly ends the
    answer ("stop") without being released, and one that does not validate fails it
    (constrained_output_invalid)."""

    def __init__(self, engine: Engine, params: SamplingParams, matcher=None, guard: CallGuard | None = None):
        self._detok = IncrementalDetokenizer(engine.decode)
        self._stops = StopMatcher(params.stop)
        self._eos = engine.eos_token_ids
        self._max_tokens = params.max_tokens
        self._report = params.logprobs is not None
        self._decode = engine.decode
        self._texts: dict[int, str] = {}  # each reported id's text: the most probable recur step after step
        self._guard = guard
        self.matcher = matcher
        self.n = 0

    def empty(self) -> Delta | None:
        """The whole answer when no token is asked for: nothing need run."""
        return Delta("", 0, "length") if self._max_tokens <= 0 else None

    def feed(self, token_id: int, logprob: float, top: tuple = ()) -> Delta:
        delta = self._feed(token_id, logprob)
        if not self._report or token_id in self._eos:
            return delta
        # a token a constraint forbids (-inf) is no alternative: JSON has no -inf either
        alternatives = tuple((i, self._text(i), lp) for i, lp in top if lp != -math.inf)
        return attrs.evolve(delta, token=(token_id, self._text(token_id), logprob, alternatives))

    def _text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._decode([token_id])
        return text

    def _feed(self, token_id: int, logprob: float) -> Delta:
        self.n += 1
        detok, stops, n = self._detok, self._stops, self.n
        if token_id in self._eos:
            text = self._released(stops.feed(detok.flush()) + stops.flush(), end=True)
            return Delta(text, n, "stop", logprob, stop=stops.matched)
        text = self._released(stops.feed(detok.add(token_id)))
        if stops.matched is not None or self._repeated():
            return Delta(text + self._released("", end=True), n, "stop", logprob, stop=stops.matched)
        if self.matcher is not None and self.matcher.done():
            text += self._tail()
            return Delta(text, n, "stop", logprob, stop=stops.matched)
        if n >= self._max_tokens:
            text += self._tail()
            reason = "stop" if stops.matched is not None or self._repeated() else "length"
            return Delta(text, n, reason, logprob, stop=stops.matched)
        return Delta(text, n, logprob=logprob)

    def _tail(self) -> str:
        text = self._stops.feed(self._detok.flush())
        return self._released(text if self._stops.matched is not None else text + self._stops.flush(), end=True)

    def _released(self, text: str, end: bool = False) -> str:
        """What of `text` may be released now (all of it without a guard); `end`: the answer
        ends here, so what the guard holds is released too (a call cut short included: the
        front end drops it)."""
        guard = self._guard
        if guard is None:
            return text
        out = guard.feed(text)
        if guard.invalid is not None:
            raise EngineError(
                "constrained_output_invalid",
                f"the constrained tool call is complete but does not validate: {guard.invalid[:300]}",
            )
        return out + guard.flush() if end and not guard.ended else out

    def _repeated(self) -> bool:
        return self._guard is not None and self._guard.ended


def generate(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, grammar=None, readout=None, monitor=None
) -> Iterator[Delta]:
    """The serial path: one Delta per decode step (text may be empty while a character or
    a possible stop string is incomplete); the last one carries finish_reason, and with a
    `readout` (steering.Readout) the activations read, with a `monitor` (steering.Monitor)
    its record — on the engines with SAE hooks."""
    guard = CallGuard(grammar.functions) if grammar is not None and grammar.kind == "tool_calls" else None
    decoder = Decoder(engine, params, engine.matcher(grammar) if grammar is not None else None, guard)

    def last(delta: Delta) -> Delta:
        return attrs.evolve(
            delta,
            sae_activations=None if readout is None else readout.result(fed),
            monitor=None if monitor is None else monitor.result(),
        )

    fed = list(prompt_ids)  # the token at each position read
    done = decoder.empty()
    if done is not None:
        yield last(done)
        return
    # only the engines with SAE hooks take observers
    observers = {k: v for k, v in (("readout", readout), ("monitor", monitor)) if v is not None}
    ids = engine.generate_ids(prompt_ids, params, decoder.matcher, **observers)
    try:
        for token_id, logprob, top in ids:
            delta = decoder.feed(token_id, logprob, top)
            if delta.finish_reason:
                delta = last(delta)
            fed.append(token_id)
            yield delta
            if delta.finish_reason:
                return
    finally:
        ids.close()
