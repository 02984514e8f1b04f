"""Tool calls in generated text, in the two forms chat templates teach models:

- Hermes/Qwen: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call;
- Llama-3 JSON: the whole answer is `{"name": …, "parameters": {…}}` (or a list of them).

`parse` reads a finished text; `ToolCallStream` reads it delta by delta for streaming,
releasing plain text as soon as it cannot begin a call, and each call (its name, then
its arguments) as soon as it closes — so a call cut short by max_tokens is never half
announced. Both give the same calls, with arguments as the raw JSON text the model
wrote, and drop an unclosed trailing call. Pure text: no torch.
"""

from __future__ import annotations

import json
import re

import attrs

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_ARGS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


@attrs.frozen
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


def _call_from_json(text: str) -> ToolCall | None:
    """A call object's name and the raw JSON of its arguments, or None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], _raw_arguments(text) or json.dumps(args, ensure_ascii=False))


def _raw_arguments(text: str) -> str | None:
    m = _ARGS_KEY.search(text)
    if not m:
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(text, m.end())
    except ValueError:
        return None
    return text[m.end():end] if isinstance(value, dict) else None


def parse(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside calls, the calls). A text with no well-formed call is all content."""
    if OPEN in text:
        content, calls, rest = [], [], text
        while OPEN in rest:
            before, _, after = rest.partition(OPEN)
            content.append(before)
            body, closed, rest = after.partition(CLOSE)
            if not closed:  # cut short: dropped
                break
            call = _call_from_json(body.strip())
            if call is None:
                return text, []
            calls.append(call)
        else:
            content.append(_without_partial_open(rest))
        return "".join(content).strip(), calls
    stripped = text.strip()
    if stripped.startswith(("{", "[")):  # Llama-3 JSON form
        try:
            value = json.loads(stripped)
        except ValueError:
            return text, []
        items = value if isinstance(value, list) else [value]
        calls = [_call_from_json(json.dumps(v)) for v in items]
        if items and all(calls) and all("name" in v and ("parameters" in v or "arguments" in v) for v in items):
            if not isinstance(value, list):  # keep the model's own argument text
                calls = [_call_from_json(stripped)]
            return "", calls
    return text, []


class ToolCallStream:
    """Incremental `parse` of Hermes-form calls: feed deltas, get events
    ("content", text) | ("call", index, name) | ("arguments", index, text)."""

    def __init__(self):
        self._buf = ""
        self._in_call = False
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[tuple]:
        self._buf += text
        events = []
        while True:
            if not self._in_call:
                i = self._buf.find(OPEN)
                if i == -1:
                    keep = _partial(self._buf, OPEN)
                    out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                    if out:
                        events.append(("content", out))
                    return events
                if i:
                    events.append(("content", self._buf[:i]))
                self._buf, self._in_call = self._buf[i + len(OPEN):], True
            j = self._buf.find(CLOSE)
            if j == -1:
                return events
            call = _call_from_json(self._buf[:j].strip())
            if call is None:  # not a well-formed call after all: give the text back as content
                events.append(("content", OPEN + self._buf[: j + len(CLOSE)]))
            else:
                events += [("call", len(self.calls), call.name), ("arguments", len(self.calls), call.arguments)]
                self.calls.append(call)
            self._buf, self._in_call = self._buf[j + len(CLOSE):], False

    def finish(self) -> list[tuple]:
        """The rest is content; an unclosed call (cut short, even inside its tag) is dropped,
        as `parse` does."""
        rest, self._buf = ("" if self._in_call else _without_partial_open(self._buf)), ""
        self._in_call = False
        return [("content", rest)] if rest else []


def _without_partial_open(text: str) -> str:
    """A text cut short in the middle of "<tool_call>" ("<tool_", say) began a call."""
    k = _partial(text, OPEN)
    return text[:-k] if k >= 2 else text


def _partial(buf: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0
