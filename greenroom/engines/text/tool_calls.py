"""Tool calls in generated text, in the forms chat templates teach models (a template's
family is its `syntax`, detected from the template: chat.tool_syntax):

- `HERMES` (Hermes/Qwen, and the description chat.py gives templates that render no tools):
  `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call;
- `LLAMA3_JSON` (Llama 3.x): the whole answer is `{"name": …, "parameters": {…}}` (or a list of
  them; Mistral's `[TOOL_CALLS][…]` reads the same once its control token is dropped).

One reading, delta by delta (`ToolCallStream`; `parse` feeds it a finished text), so a
streamed answer and a finished one have the same calls and the same content. Without a
syntax both forms are read (the front end does not know the model's family, and a model may
write either); with one, only that one:

- text is released as soon as it cannot begin a call; a call (its name, then its arguments)
  once its block closes, so a call cut short by max_tokens is never half announced, and its
  markup never becomes content;
- a block is a call only if it names one of the request's functions and its arguments
  validate against that function's parameters (jsonschema, Draft 2020-12) and hold only
  numbers every client holds (`load_json`); any other block is dropped, never content;
- the answer ends at a call that repeats an earlier one exactly (name and arguments):
  neither it nor anything after it is part of the answer;
- whitespace before a call, and at the end of an answer with calls, is not content;
- a whole answer in the JSON form is calls if every item is a valid call, else content.

`CallGuard` is the decoder's side of the same reading, for a constrained answer: it holds a
call's text back until it is known to be a valid call that repeats none before it.
Pure text: no torch.
"""

from __future__ import annotations

import json
import math
import re

import attrs
import jsonschema
import referencing.exceptions

OPEN, CLOSE = "<tool_call>", "</tool_call>"
HERMES, LLAMA3_JSON = "hermes", "llama3_json"  # the call syntaxes (see the module's docstring)
SYNTAXES = (HERMES, LLAMA3_JSON)
MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer JavaScript's JSON.parse (a double) holds exactly
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}  # what a function without takes


@attrs.frozen
class ToolCall:
    name: str
    arguments: str  # JSON text of an object


def load_json(text: str):
    """`text` parsed as every client holds it, else ValueError: a number that parses to
    infinity (`1e999`), NaN or Infinity, or an integer past ±MAX_SAFE_INTEGER is refused."""
    return json.loads(text, parse_float=_finite, parse_int=_safe_int, parse_constant=_no_constant)


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # e.g. 1e999: valid JSON syntax, not a representable number
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _safe_int(text: str) -> int:
    if len(text.lstrip("-")) > 16 or abs(int(text)) > MAX_SAFE_INTEGER:
        raise ValueError(f"the integer {text[:40]} is past ±{MAX_SAFE_INTEGER}, which clients cannot hold exactly")
    return int(text)


def _no_constant(text: str):
    raise ValueError(f"{text} is not a JSON number")


def functions(tools: list[dict] | None) -> dict[str, dict | None] | None:
    """OpenAI tool objects → {name: parameters (None: the function takes none)}."""
    if tools is None:
        return None
    return {t["function"]["name"]: t["function"].get("parameters") for t in tools}


class Functions(dict):
    """{name: parameters (None: none)} of the functions a tool-call grammar calls, and the
    syntax its calls are written in (what the decoder's CallGuard reads them by)."""

    def __init__(self, items, syntax: str = HERMES):
        super().__init__(items)
        self.syntax = _syntax(syntax)


def _syntax(syntax: str | None) -> str | None:
    if syntax is not None and syntax not in SYNTAXES:
        raise ValueError(f"unknown tool-call syntax {syntax!r} (one of {', '.join(SYNTAXES)})")
    return syntax


def _call_from_json(text: str) -> ToolCall | None:
    """A call object's name and the raw JSON of its arguments, or None."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    key = "arguments" if "arguments" in obj else "parameters"
    args = obj.get(key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    raw = _members(text).get(key)
    return ToolCall(
        obj["name"], raw if raw is not None and raw.startswith("{") else json.dumps(args, ensure_ascii=False)
    )


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _members(text: str) -> dict[str, str]:
    """The raw JSON text of each top-level member of the object `text` (which json.loads has
    read), by key; the last of a repeated key, as json.loads keeps it."""
    out = {}
    at = _SPACE.match(text).end() + 1  # past "{"
    while True:
        at = _SPACE.match(text, at).end()
        if text[at] == "}":
            return out
        key, at = json.decoder.scanstring(text, at + 1)
        at = _SPACE.match(text, _SPACE.match(text, at).end() + 1).end()  # past ":"
        _, end = _DECODER.raw_decode(text, at)
        out[key] = text[at:end]
        at = _SPACE.match(text, end).end()
        at += text[at] == ","


class _Judge:
    """Which call bodies are calls: valid against `functions` (None: any name, any object of
    arguments a client holds), and not a repeat of one judged before."""

    def __init__(self, functions: dict[str, dict | None] | None):
        self._validators = (
            None
            if functions is None
            else {
                name: jsonschema.Draft202012Validator(_NO_PARAMETERS if params is None else params)
                for name, params in functions.items()
            }
        )
        self._seen: list[tuple[str, object]] = []

    def judge(self, body: str) -> tuple[str, ToolCall | str]:
        """("call", the call) | ("repeat", the call) | ("invalid", why)."""
        call = _call_from_json(body.strip())
        if call is None:
            return "invalid", f"not a call object: {body.strip()[:80]}"
        try:
            args = load_json(call.arguments)
        except ValueError as exc:
            return "invalid", f"{call.name}: {exc}"
        if self._validators is not None:
            validator = self._validators.get(call.name)
            if validator is None:
                return "invalid", f"{call.name!r} is not one of the tools"
            try:
                error = jsonschema.exceptions.best_match(validator.iter_errors(args))
            except referencing.exceptions.Unresolvable as exc:  # a remote $ref: never fetched
                return "invalid", f"{call.name}: its parameters cannot be checked: {exc}"
            if error is not None:
                return "invalid", f"{call.name}: {error.message}"
        if (call.name, args) in self._seen:
            return "repeat", call
        self._seen.append((call.name, args))
        return "call", call

    def judge_all(self, bodies: list[str]) -> list[tuple] | None:
        """Each body's verdict, or None (and none remembered) if any is invalid."""
        seen = list(self._seen)
        verdicts = [self.judge(b) for b in bodies]
        if any(v == "invalid" for v, _ in verdicts):
            self._seen = seen
            return None
        return verdicts


class _Blocks:
    """Text → ("text", text) | ("block", body, raw) pieces: text as soon as it cannot begin
    the opening tag, a block once it has closed (`_BlockEnd`). `tagged=False`: a syntax
    without blocks, all text."""

    def __init__(self, tagged: bool = True):
        self._buf = ""
        self._end: _BlockEnd | None = None  # the open block's reader
        self._tagged = tagged

    def feed(self, text: str) -> list[tuple]:
        if not self._tagged:
            return [("text", text)] if text else []
        self._buf += text
        out: list[tuple] = []
        while True:
            if self._end is None:
                i = self._buf.find(OPEN)
                if i == -1:
                    cut = len(self._buf) - _partial(self._buf, OPEN)
                    if cut:
                        out.append(("text", self._buf[:cut]))
                        self._buf = self._buf[cut:]
                    return out
                if i:
                    out.append(("text", self._buf[:i]))
                self._buf, self._end = self._buf[i:], _BlockEnd(len(OPEN))
            end = self._end.find(self._buf)
            if end is None:
                return out
            out.append(("block", self._buf[len(OPEN) : end - len(CLOSE)], self._buf[:end]))
            self._buf, self._end = self._buf[end:], None

    def finish(self) -> str:
        """What is held: a call cut short, or text that could only begin one ("<tool_", "<")."""
        rest, self._buf, self._end = self._buf, "", None
        return rest


_OUTSIDE_STRINGS = frozenset(" \t\n\r,:0123456789+-.eEtrufalsn")  # what JSON has between its strings


class _BlockEnd:
    """Where a call block ends, read by the JSON grammar as the block grows: its body is one
    JSON value, whose end is its closing bracket outside every string (a brace, a quote or a
    `</tool_call>` inside a string is the string's, escapes included), then the closing tag.
    A body that stops being JSON (a character JSON cannot have there) ends at the first closing
    tag from that point: it is no call either way."""

    def __init__(self, start: int):
        self._at = start  # the next character to read
        self._state = "before"  # before the value | value | after it | tag (not JSON: the next tag ends it)
        self._depth = 0
        self._string = self._escape = False

    def find(self, buf: str) -> int | None:
        """The index just past the block's closing tag in `buf` (the block from its opening
        tag, grown since the last call), or None while it has not come."""
        while self._at < len(buf):
            if self._state == "tag":
                j = buf.find(CLOSE, self._at)
                if j == -1:
                    self._at = max(self._at, len(buf) - len(CLOSE) + 1)
                    return None
                return j + len(CLOSE)
            c = buf[self._at]
            if self._state != "value":
                if c in " \t\n\r":
                    self._at += 1
                elif self._state == "before" and c in "{[":
                    self._state = "value"
                elif self._state == "after" and buf.startswith(CLOSE, self._at):
                    return self._at + len(CLOSE)
                elif self._state == "after" and CLOSE.startswith(buf[self._at :]):
                    return None  # the closing tag, begun
                else:
                    self._state = "tag"
                continue
            if self._string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._string = False
            elif c == '"':
                self._string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if not self._depth:
                    self._state = "after"
            elif c not in _OUTSIDE_STRINGS:
                self._state = "tag"
                continue
            self._at += 1
        return None


class ToolCallStream:
    """Feed text deltas, get events ("content", text) | ("call", index, name) |
    ("arguments", index, text). `tools`: the request's OpenAI tool objects (None: any
    function, its arguments only checked to be an object clients hold); `syntax`: HERMES or
    LLAMA3_JSON reads that form only, None both."""

    def __init__(self, tools: list[dict] | None = None, syntax: str | None = None):
        syntax = _syntax(syntax)
        self._blocks = _Blocks(tagged=syntax != LLAMA3_JSON)
        self._judge = _Judge(functions(tools))
        self._space = ""  # content's trailing whitespace, held until it is known not to precede a call
        # the answer so far while it may be the JSON form; None once it is not (or never, in HERMES)
        self._json: str | None = None if syntax == HERMES else ""
        self._blocked = False  # a block (a call or not) was read: trailing whitespace is not content
        self.calls: list[ToolCall] = []
        self.ended = False  # a repeated call ended the answer

    def feed(self, text: str) -> list[tuple]:
        if self._json is not None:
            self._json += text
            head = self._json.lstrip()
            if not head or head[0] in "{[":
                return []  # the JSON form is judged whole, at the end
            text, self._json = self._json, None
        return self._read(self._blocks.feed(text))

    def finish(self) -> list[tuple]:
        """The rest: an unclosed call (cut short, even inside its tag) is dropped, as is the
        whitespace after the last call."""
        events: list[tuple] = []
        if self._json is not None:
            text, self._json = self._json, None
            json_form = self._json_form(text)
            if json_form is not None:
                return json_form
            events = self._read(self._blocks.feed(text))
        self._blocks.finish()  # a call cut short: never announced, never content
        if self._space and not self._blocked:
            events.append(("content", self._space))
        self._space = ""
        return events

    def _read(self, pieces: list[tuple]) -> list[tuple]:
        events: list[tuple] = []
        for kind, *rest in pieces:
            if self.ended:
                break
            if kind == "text":
                pending = self._space + rest[0]
                body = pending.rstrip()
                self._space = pending[len(body) :]
                if body:
                    events.append(("content", body))
                continue
            self._space, self._blocked = "", True
            verdict, call = self._judge.judge(rest[0])
            if verdict == "repeat":
                self.ended = True
            elif verdict == "call":
                events += self._announce(call)
        return events

    def _announce(self, call: ToolCall) -> list[tuple]:
        self.calls.append(call)
        index = len(self.calls) - 1
        return [("call", index, call.name), ("arguments", index, call.arguments)]

    def _json_form(self, text: str) -> list[tuple] | None:
        """The events of a whole answer in the Llama-3 JSON form, or None if it is not one."""
        try:
            value = json.loads(text)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        if not items or not all(
            isinstance(v, dict) and "name" in v and ("parameters" in v or "arguments" in v) for v in items
        ):
            return None
        # one object keeps the model's own argument text
        bodies = [text] if not isinstance(value, list) else [json.dumps(v, ensure_ascii=False) for v in items]
        verdicts = self._judge.judge_all(bodies)
        if verdicts is None:
            return None
        events: list[tuple] = []
        for verdict, call in verdicts:
            if verdict == "repeat":
                self.ended = True
                break
            events += self._announce(call)
        return events


def parse(text: str, tools: list[dict] | None = None, syntax: str | None = None) -> tuple[str, list[ToolCall]]:
    """(the content, the calls) of a finished text: what `ToolCallStream` gives for it."""
    stream = ToolCallStream(tools, syntax)
    events = stream.feed(text) + stream.finish()
    return "".join(e[1] for e in events if e[0] == "content"), stream.calls


class CallGuard:
    """A constrained tool-call answer as the decoder releases it: each block's text is held
    until it closes, then released if it is a valid call that repeats none before it. A
    repeat ends the answer (`ended`), its text unreleased; an invalid call sets `invalid`
    (why), which fails the request (a constrained document that does not validate).
    `syntax` (default: the one `functions` carries, a `Functions`; else HERMES): in
    LLAMA3_JSON the whole answer is held until it is a complete JSON value, then judged."""

    def __init__(self, functions: dict[str, dict | None], syntax: str | None = None):
        self.syntax = _syntax(syntax) or getattr(functions, "syntax", HERMES)
        self._blocks = _Blocks()
        self._judge = _Judge(functions)
        self._held = ""  # LLAMA3_JSON: the answer so far
        self.ended = False
        self.invalid: str | None = None

    def feed(self, text: str) -> str:
        if self.syntax == LLAMA3_JSON:
            return self._feed_json(text)
        out = []
        for kind, *rest in self._blocks.feed(text):
            if kind == "text":
                out.append(rest[0])
                continue
            verdict, detail = self._judge.judge(rest[0])
            if verdict == "repeat":
                self.ended = True
            elif verdict == "invalid":
                self.invalid = detail
            else:
                out.append(rest[1])
                continue
            break  # nothing after a repeat is the answer; an invalid call fails it
        return "".join(out)

    def _feed_json(self, text: str) -> str:
        """The JSON form: held until it is a complete JSON value, released if every call in
        it is valid (a repeat inside a list is the reader's to end at: nothing is generated
        after the value)."""
        self._held += text
        body = self._held.strip()
        if not body or body[-1] not in "}]":
            return ""
        try:
            value = json.loads(body)
        except ValueError:
            return ""  # not complete yet
        for item in value if isinstance(value, list) else [value]:
            verdict, detail = self._judge.judge(
                json.dumps(item, ensure_ascii=False) if isinstance(value, list) else body
            )
            if verdict == "invalid":
                self.invalid = detail
                return ""
        out, self._held = self._held, ""
        return out

    def flush(self) -> str:
        """What is held when the answer ends for another reason (EOS, max_tokens)."""
        if self.syntax == LLAMA3_JSON:
            rest, self._held = self._held, ""
            return rest
        return self._blocks.finish()


def _partial(buf: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0
