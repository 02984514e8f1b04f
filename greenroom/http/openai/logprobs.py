"""Log-probabilities in OpenAI's shapes: chat's `logprobs.content` (token, logprob, bytes,
top_logprobs) and text completions' legacy object (tokens, token_logprobs, top_logprobs as
dicts, text_offset) — for a generation's tokens (the engine's Text events carry each as [id,
text, log-probability, [[id, text, log-probability], …]]), streamed and not, and for scoring's
answers (scoring.py writes an echoed prompt's tokens with a `Writer`, the scored token with
`entry` and `append`).

A generated token's log-probability is the model's log-softmax at temperature 1 — before
temperature, top_p, top_k and the penalties, after a constraint's mask — as vLLM reports by
default (its raw_logprobs); `bytes` is the UTF-8 of the decoded token (the spec's rule for
chat scoring); `return_tokens_as_token_ids` writes each token "token_id:<id>".
"""

from __future__ import annotations

from greenroom.http.core.contracts import ListOf, MapOf, Number
from greenroom.http.core.objects import COUNT, FLOAT, NONE, TEXT, Object, or_null
from greenroom.protocol import Admitted, Generate

TOP_LOGPROB = Object(
    name="TopLogprob",
    fields={"token": TEXT, "logprob": FLOAT, "bytes": ListOf(items=Number(integer=True, lo=0, hi=255))},
)
CHAT_LOGPROBS = Object(
    name="ChatLogprobs",
    fields={
        "content": ListOf(
            items=Object(name="TokenLogprob", fields={**TOP_LOGPROB.fields, "top_logprobs": ListOf(items=TOP_LOGPROB)})
        ),
        "refusal": NONE,
    },
    description="Each token's log-probability: the model's at temperature 1, after a constraint's mask",
)
TOKEN_LOGPROB = CHAT_LOGPROBS.fields["content"].items
COMPLETION_LOGPROBS = Object(
    name="CompletionLogprobs",
    fields={
        "tokens": ListOf(items=TEXT),
        # echo: the prompt's first token has no log-probability (null, as OpenAI's and vLLM's)
        "token_logprobs": ListOf(items=or_null(FLOAT)),
        "top_logprobs": ListOf(items=or_null(MapOf(values=FLOAT))),
        "text_offset": ListOf(items=COUNT),
    },
)


def key(token_id: int, text: str, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else text


def entry(token: str, text: str, logprob: float) -> dict:
    """One chat entry without its alternatives."""
    return TOP_LOGPROB.build(token=token, logprob=logprob, bytes=list(text.encode("utf-8")))


def chat_entry(token: str, text: str, logprob: float, top: list[dict]) -> dict:
    """One chat entry with its alternatives (`entry`s)."""
    return TOKEN_LOGPROB.build(**entry(token, text, logprob), top_logprobs=top)


def chat(content: list[dict]) -> dict:
    """Chat's logprobs object (OpenAI's ChoiceLogprobs: no refusal is ever generated here)."""
    return CHAT_LOGPROBS.build(content=content, refusal=None)


def append(logprobs: dict, token: str, logprob: float | None, top: dict | None, offset: int) -> None:
    """One token onto a text completion's logprobs object."""
    logprobs["tokens"].append(token)
    logprobs["token_logprobs"].append(logprob)
    logprobs["top_logprobs"].append(top)
    logprobs["text_offset"].append(offset)


def empty() -> dict:
    return COMPLETION_LOGPROBS.build(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])


class Writer:
    """One choice's generated tokens as its logprobs object; called per streamed chunk (the
    tokens of that chunk's delta), a text completion's offsets go on from the last call."""

    def __init__(self, chat: bool, as_ids: bool, offset: int):
        self._chat, self._as_ids, self._offset = chat, as_ids, offset

    def __call__(self, tokens: list) -> dict:
        as_ids = self._as_ids
        if self._chat:
            return chat(
                [
                    chat_entry(
                        key(token_id, text, as_ids),
                        text,
                        logprob,
                        [entry(key(i, t, as_ids), t, lp) for i, t, lp in top],
                    )
                    for token_id, text, logprob, top in tokens
                ]
            )
        out = empty()
        for token_id, text, logprob, top in tokens:
            token = key(token_id, text, as_ids)
            alternatives: dict[str, float] | None = None
            if top is not None:  # None: an echoed prompt's first token, which nothing predicts
                alternatives = {}
                for i, t, lp in top:  # two ids with one text share the entry of the more probable
                    alternatives.setdefault(key(i, t, as_ids), lp)
                alternatives.setdefault(token, logprob)  # OpenAI: the sampled token too, up to logprobs + 1 entries
            append(out, token, logprob, alternatives, self._offset)
            self._offset += len(text)
        return out

    @property
    def offset(self) -> int:
        """Where the next token's text starts."""
        return self._offset


def writers(gen: Generate, admitted: Admitted, chat: bool, as_ids: bool) -> dict[int, Writer]:
    """A writer per choice of a generation that asks for logprobs (one that does not needs none:
    its callers ask only for one that does); a text completion's first offset is its prompt's
    length (prompt plus completion: OpenAI's convention, as scoring's)."""
    chars = admitted.prompt_chars
    return {i: Writer(chat, as_ids, chars[i // gen.n] if chars else 0) for i in range(gen.choices)}
