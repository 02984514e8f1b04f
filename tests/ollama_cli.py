"""The `ollama` command-line client, emulated for the test tier: every command sends exactly the
requests the CLI sends and returns what it would print.

Built from ollama/ollama's source at commit fe9298a5bdc84f9351238b50e8e1427ba9e9c9b3 (read with the
search tool): cmd/cmd.go (each command's handler: its requests, their order and what it prints)
and cmd/interactive.go (`ollama run`'s session), with the api package of that release —
api/types.go (the request structs: which fields are always serialised, as `{"model": "",
"name": "X"}` where a command fills only `name`; the response structs the CLI decodes into) and
api/client.go (headers; `do` reads a whole body, `stream` reads NDJSON line by line; errors:
`StatusError`, whose text is `<Status>: <message>` where the client knows the status line, as
`stream` does, and the message alone where it does not, as `do`) — and parser/parser.go
(a Modelfile → the CreateRequest `ollama create` sends, uploading each local file as a blob
first) and format/ (sizes, times).

Exactly as the CLI: the method, path, headers (`User-Agent: ollama/0.0.0 (amd64 linux)
Go/go1.24.0` — a CLI built from that commit without release flags reports version 0.0.0 — and
`Accept`), the bodies as Go's encoding/json writes them (struct fields in declaration order,
`omitempty` honoured, map keys sorted, `<`, `>`, `&` escaped), a blob uploaded with chunked
transfer encoding as Go's client sends an `io.Reader` of unknown length; responses decoded into
the fields of the Go structs (a field of the wrong JSON type fails the command as Go's decoder
would, a field left out reads as its zero value), and the errors the CLI prints (`Error: …`,
exit code 1; a Go panic, exit code 2, where `showInfo` asserts a type). Not emulated: progress
bars and spinners (their statuses are kept in `Result.progress`), colours and readline's
escape codes, word wrapping (as on a terminal of unknown width), a session's multi-line input,
/load and /save, image and embedding models, `--experimental`, Ctrl-C, a name's validation, and
the commands greenroom's docs do not name (serve, signin, …).
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import math
import os
import re
import struct
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import httpx

USER_AGENT = "ollama/0.0.0 (amd64 linux) Go/go1.24.0"
_DEFAULT_PORT = 11434


# --- Go's encoding/json ---------------------------------------------------------------------------


def _go_numbers(value):
    """Floats as Go writes them: a whole number without a fraction (0, not 0.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, list):
        return [_go_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _go_numbers(v) for k, v in value.items()}
    return value


def go_json(value) -> bytes:
    """`json.Marshal`: compact, UTF-8, and HTML-safe (<, >, & and the two line separators escaped)."""
    text = json.dumps(_go_numbers(value), ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text.encode()


def _sorted(mapping: dict | None) -> dict | None:
    """A Go map as json.Marshal writes it: keys sorted."""
    return None if mapping is None else {k: mapping[k] for k in sorted(mapping)}


class GoError(Exception):
    """An error the CLI returns: printed as `Error: <text>`."""


class GoPanic(Exception):
    """A Go runtime panic (a failed type assertion): the CLI dies with exit code 2."""


class StatusError(GoError):
    """api.StatusError: `Status` (the status line, as Go's client keeps it) is known to `stream`."""

    def __init__(self, status_code: int, status: str, message: str):
        self.status_code, self.status, self.message = status_code, status, message
        if status and message:
            text = f"{status}: {message}"
        else:
            text = status or message or "something went wrong, please see the ollama server logs for details"
        super().__init__(text)


class AuthorizationError(GoError):
    def __init__(self, status_code: int, status: str, signin_url: str):
        self.status_code, self.signin_url = status_code, signin_url
        super().__init__(status or "something went wrong, please see the ollama server logs for details")


# --- the response structs (api/types.go) and Go's decoder -------------------------------------------

TIME = "time.Time"  # an RFC 3339 string; null or absent: the zero time (None here)
_DETAILS = {
    "parent_model": str,
    "format": str,
    "family": str,
    "families": [str],
    "parameter_size": str,
    "quantization_level": str,
}
_TOOL_CALL = {"id": str, "function": {"index": int, "name": str, "arguments": dict}}
_MESSAGE = {
    "role": str,
    "content": str,
    "thinking": str,
    "images": [str],
    "tool_calls": [_TOOL_CALL],
    "tool_name": str,
    "tool_call_id": str,
}
_METRICS = {
    "total_duration": int,
    "load_duration": int,
    "prompt_eval_count": int,
    "prompt_eval_duration": int,
    "eval_count": int,
    "eval_duration": int,
}
_LOGPROB = {"token": str, "logprob": float, "bytes": [int], "top_logprobs": [{"token": str, "logprob": float}]}
GENERATE_RESPONSE = {
    "model": str,
    "remote_model": str,
    "remote_host": str,
    "created_at": TIME,
    "response": str,
    "thinking": str,
    "done": bool,
    "done_reason": str,
    "context": [int],
    **_METRICS,
    "tool_calls": [_TOOL_CALL],
    "logprobs": [_LOGPROB],
}
CHAT_RESPONSE = {
    "model": str,
    "remote_model": str,
    "remote_host": str,
    "created_at": TIME,
    "message": _MESSAGE,
    "done": bool,
    "done_reason": str,
    "logprobs": [_LOGPROB],
    **_METRICS,
}
SHOW_RESPONSE = {
    "license": str,
    "modelfile": str,
    "parameters": str,
    "template": str,
    "system": str,
    "renderer": str,
    "parser": str,
    "details": _DETAILS,
    "messages": [_MESSAGE],
    "remote_model": str,
    "remote_host": str,
    "model_info": dict,
    "projector_info": dict,
    "tensors": [{"name": str, "type": str, "shape": [int]}],
    "capabilities": [str],
    "modified_at": TIME,
    "requires": str,
}
LIST_RESPONSE = {
    "models": [
        {
            "name": str,
            "model": str,
            "remote_model": str,
            "remote_host": str,
            "modified_at": TIME,
            "size": int,
            "digest": str,
            "details": _DETAILS,
        }
    ]
}
PROCESS_RESPONSE = {
    "models": [
        {
            "name": str,
            "model": str,
            "size": int,
            "digest": str,
            "details": _DETAILS,
            "expires_at": TIME,
            "size_vram": int,
            "context_length": int,
        }
    ]
}
PROGRESS_RESPONSE = {"status": str, "digest": str, "total": int, "completed": int}
# the structs the CLI decodes answers into, by their Go names
STRUCTS = {
    "GenerateResponse": GENERATE_RESPONSE,
    "ChatResponse": CHAT_RESPONSE,
    "ShowResponse": SHOW_RESPONSE,
    "ListResponse": LIST_RESPONSE,
    "ProcessResponse": PROCESS_RESPONSE,
    "ProgressResponse": PROGRESS_RESPONSE,
    "UserResponse": {"name": str},
}
_ERROR_LINE = {"error": str, "signin_url": str}
_GO_TYPES = {str: "string", bool: "bool", int: "int64", float: "float64", dict: "map[string]interface {}"}
_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _zero(schema):
    """A Go type's zero value: a struct's fields all zero; nil (None) for slices, maps and times."""
    if isinstance(schema, dict):
        return {k: _zero(v) for k, v in schema.items()}
    return {str: "", bool: False, int: 0, float: 0.0}.get(schema) if isinstance(schema, type) else None


def decode(value, schema, where: str):
    """`value` (parsed JSON) read into the Go type `schema` as json.Unmarshal reads it: unknown fields
    ignored, a null or an absent field its zero value, a value of another JSON type an error."""

    def wrong(go_type: str) -> GoError:
        return GoError(f"json: cannot unmarshal {_json_kind(value)} into Go struct field {where} of type {go_type}")

    if value is None:
        return _zero(schema)
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise wrong("struct")
        return {k: decode(value.get(k), sub, f"{where}.{k}") for k, sub in schema.items()}
    if isinstance(schema, list):
        if not isinstance(value, list):
            raise wrong("[]" + _GO_TYPES.get(schema[0], "struct"))
        return [decode(v, schema[0], where) for v in value]
    if schema == TIME:
        if not isinstance(value, str) or not _RFC3339.fullmatch(value):
            raise GoError(f'parsing time {json.dumps(json.dumps(value))} as "\\"2006-01-02T15:04:05Z07:00\\""')
        whole, fraction, zone = _RFC3339.fullmatch(value).group(1, 2, 3)
        at = datetime.datetime.fromisoformat(whole + (fraction or "")[:7] + zone.replace("Z", "+00:00"))
        return None if at == datetime.datetime(1, 1, 1, tzinfo=datetime.UTC) else at  # Go's zero time
    if schema is bool and not isinstance(value, bool):
        raise wrong("bool")
    if schema is str and not isinstance(value, str):
        raise wrong("string")
    if schema is int and not (isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63):
        raise wrong("int64")
    if schema is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise wrong("float64")
    if schema is dict and not isinstance(value, dict):
        raise wrong("map[string]interface {}")
    return value


# --- format/ ----------------------------------------------------------------------------------------


def human_bytes(b: int) -> str:
    """format.HumanBytes: binary multiples, decimal-looking units."""
    for unit, scale in (("TB", 1 << 40), ("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= scale:
            value = b / scale
            if value >= 10:
                return f"{int(value)} {unit}"
            return f"{value:.1f} {unit}" if value != math.trunc(value) else f"{int(value)} {unit}"
    return f"{b} B"


def human_number(n: int) -> str:
    """format.HumanNumber."""
    if n >= 1_000_000_000:
        v = n / 1_000_000_000
        return f"{v:.0f}B" if v == math.floor(v) else f"{v:.1f}B"
    if n >= 1_000_000:
        v = n / 1_000_000
        return f"{v:.0f}M" if v == math.floor(v) else f"{v:.2f}M"
    if n >= 1_000:
        return f"{n / 1000:.0f}K"
    return str(n)


def _div(a: int, b: int) -> int:
    """Go's integer division: truncated toward zero."""
    return int(a / b)


def _human_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = math.floor(seconds / 3600 + 0.5)  # math.Round: half away from zero
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


def human_time(at: datetime.datetime | None, zero: str) -> str:
    """format.HumanTime."""
    if at is None:
        return zero
    delta = (datetime.datetime.now(datetime.UTC) - at).total_seconds()
    if _div(_div(int(delta / 3600), 24), 365) < -20:
        return "Forever"
    if delta < 0:
        return _human_duration(-delta) + " from now"
    return _human_duration(delta) + " ago"


def go_duration(ns: int) -> str:
    """time.Duration's String()."""
    if ns == 0:
        return "0s"
    sign, u = ("-" if ns < 0 else ""), abs(ns)

    def frac(v: int, unit: int) -> str:
        whole, part = divmod(v, unit)
        return str(whole) + ("." + str(part).rjust(len(str(unit)) - 1, "0").rstrip("0") if part else "")

    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return sign + frac(u, 1_000) + "µs"
    if u < 1_000_000_000:
        return sign + frac(u, 1_000_000) + "ms"
    hours, rest = divmod(u, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = frac(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    return f"{sign}{minutes}m{seconds}" if minutes else sign + seconds


_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> int:
    """time.ParseDuration, in nanoseconds."""
    sign, rest = (-1, text[1:]) if text.startswith("-") else (1, text.removeprefix("+"))
    if rest == "0":
        return 0
    total, at = 0.0, 0
    while at < len(rest):
        m = _DURATION_PART.match(rest, at)
        if m is None or m.group(1) in ("", "."):
            raise GoError(f'time: invalid duration "{text}"')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        at = m.end()
    if not rest:
        raise GoError(f'time: invalid duration "{text}"')
    return sign * int(total)


def _duration_json(ns: int):
    """api.Duration's MarshalJSON: a negative duration is -1, any other its String()."""
    return -1 if ns < 0 else go_duration(ns)


def _go_v(value) -> str:
    """fmt's %v of the option values the CLI holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(_go_v(v) for v in value) + "]"
    if isinstance(value, float):
        return _go_g(value)
    return str(value)


def _float_text(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)


# --- api.FormatParams and the Modelfile parser (parser/parser.go) ---------------------------------------

# api.Options' fields (with api.Runner's) by their JSON name, as FormatParams types a text value
_OPTION_KINDS = {
    **dict.fromkeys(("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread"), "int"),
    "use_mmap": "bool",
    **dict.fromkeys(("num_keep", "seed", "num_predict", "top_k", "repeat_last_n"), "int"),
    **dict.fromkeys(
        ("top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty", "frequency_penalty"),
        "float32",
    ),
    "stop": "[]string",
}
_DEPRECATED = (
    "penalize_newline",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mlock",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)
_GO_TRUE, _GO_FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")


def _float32(text: str) -> float:
    """strconv.ParseFloat(text, 32), as the float32 that json.Marshal writes back (shortest form)."""
    try:
        wide = float(text)
    except ValueError:
        raise GoError(f"invalid float value [{text}]") from None
    narrow = struct.unpack("<f", struct.pack("<f", wide))[0]
    for digits in range(1, 10):
        shortest = float(f"{narrow:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", shortest))[0] == narrow:
            return shortest
    return narrow


def format_params(name: str, values: list[str]):
    """api.FormatParams for one parameter: its value typed as api.Options types it."""
    kind = _OPTION_KINDS.get(name)
    if kind is None:
        raise GoError(f"unknown parameter '{name}'")
    if kind == "[]string":
        return list(values)
    first = values[0]
    if kind == "float32":
        return _float32(first)
    if kind == "int":
        if not re.fullmatch(r"[+-]?\d+", first):
            raise GoError(f"invalid int value [{' '.join(values)}]")
        return int(first)
    if first in _GO_TRUE or first in _GO_FALSE:
        return first in _GO_TRUE
    raise GoError(f"invalid bool value [{' '.join(values)}]")


class ParserError(GoError):
    pass


_COMMANDS = (
    "from",
    "license",
    "template",
    "system",
    "adapter",
    "renderer",
    "parser",
    "parameter",
    "message",
    "requires",
)
_INVALID_COMMAND = 'command must be one of "from", "license", "template", "system", "adapter", "renderer", "parser", "parameter", "message", or "requires"'
_INVALID_ROLE = 'message role must be one of "system", "user", or "assistant"'
NIL, NAME, VALUE, PARAMETER, MESSAGE, COMMENT = range(6)


def _unquote(s: str) -> tuple[str, bool]:
    if s.startswith('"""'):
        return (s[3:-3], True) if len(s) >= 6 and s.endswith('"""') else ("", False)
    if s.startswith('"'):
        return (s[1:-1], True) if len(s) >= 2 and s.endswith('"') else ("", False)
    return s, True


def _printable(ch: str) -> bool:
    return ch == " " or (ch.isprintable() and not ch.isspace())


def parse_modelfile(text: str) -> list[tuple[str, str]]:
    """parser.ParseFile: the Modelfile's commands as (name, args) — FROM is "model", a PARAMETER its
    parameter's name, a MESSAGE "message" with args `role: content`."""
    commands: list[tuple[str, str]] = []
    name, role, buf, state, line = "", "", "", NIL, 1

    def step(ch: str, cs: int):
        space, newline = ch in " \t", ch in "\r\n"
        if cs == NIL:
            return (COMMENT, "") if ch == "#" else (NIL, "") if space or newline else (NAME, ch)
        if cs == NAME:
            if ch.isascii() and ch.isalpha():
                return NAME, ch
            if space:
                return VALUE, ""
            raise ParserError(f"(line {line}): {_INVALID_COMMAND}")
        if cs == VALUE:
            return (NIL, ch) if newline or space else (VALUE, ch)
        if cs in (PARAMETER, MESSAGE):
            if ch.isascii() and (ch.isalpha() or (cs == PARAMETER and (ch.isdigit() or ch == "_"))):
                return cs, ch
            if space:
                return VALUE, ""
            raise GoError(f"unexpected EOF: {buf}")
        return (NIL, "") if newline else (COMMENT, "")

    for ch in text.removeprefix("\ufeff"):
        if ch in "\r\n":
            line += 1
        nxt, out = step(ch, state)
        if nxt != state:
            if state == NAME:
                if buf.lower() not in _COMMANDS:
                    raise ParserError(f"(line {line}): {_INVALID_COMMAND}")
                word = buf.lower()
                if word == "from":
                    name = "model"
                elif word == "parameter":
                    nxt = PARAMETER
                else:
                    nxt = MESSAGE if word == "message" else nxt
                    name = word
            elif state == PARAMETER:
                name = buf
            elif state == MESSAGE:
                if buf not in ("system", "user", "assistant"):
                    raise ParserError(f"(line {line}): {_INVALID_ROLE}")
                role = buf
            elif state == VALUE:
                value, ok = _unquote(buf.strip())
                if not ok or out in (" ", "\t"):
                    buf += out
                    continue
                if role:
                    value, role = f"{role}: {value}", ""
                commands.append((name, value))
            buf, state = "", nxt
        if out and _printable(out):
            buf += out
    if state == VALUE:
        value, ok = _unquote(buf.strip())
        if not ok:
            raise GoError("unexpected EOF")
        commands.append((name, f"{role}: {value}" if role else value))
    elif state not in (NIL, COMMENT):
        raise GoError("unexpected EOF")
    if not any(n == "model" for n, _ in commands):
        raise GoError("no FROM line")
    return commands


def _expand(path: str, relative_dir: Path) -> Path:
    """parser's expandPath: ~ is the home directory, a relative path the Modelfile's directory's;
    made absolute as filepath.Abs makes it (lexically: a link is not followed)."""
    if path == "~" or path.startswith("~/"):
        path = os.path.expanduser(path)
    return Path(os.path.abspath(os.path.join(relative_dir, path)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


@attrs.define
class CreateRequest:
    """api.CreateRequest as parser.CreateRequest fills it (files: local path → digest)."""

    model: str = ""
    quantize: str = ""
    from_: str = ""
    files: dict | None = None
    template: str = ""
    license: list | None = None
    system: str = ""
    parameters: dict | None = None
    messages: list | None = None
    renderer: str = ""
    parser: str = ""
    requires: str = ""

    def body(self) -> dict:
        """As json.Marshal writes api.CreateRequest: `model` and the deprecated `name` always, every
        other field only when it is not empty."""
        fields = (
            ("quantize", self.quantize),
            ("from", self.from_),
            ("files", _sorted(self.files)),
            ("template", self.template),
            ("license", self.license),
            ("system", self.system),
            ("parameters", _sorted(self.parameters)),
            ("messages", self.messages),
            ("renderer", self.renderer),
            ("parser", self.parser),
            ("requires", self.requires),
        )
        return {"model": self.model, **{k: v for k, v in fields if v}, "name": ""}


def create_request(commands: list[tuple[str, str]], relative_dir: Path, out: list[str]) -> CreateRequest:
    """parser.Modelfile.CreateRequest; a deprecated parameter's warning goes to `out` (stdout)."""
    req, params, messages, licenses = CreateRequest(), {}, [], []
    for name, args in commands:
        if name == "model":
            path = _expand(args, relative_dir)
            if not path.exists():
                req.from_ = args
                continue
            if path.is_dir():
                raise NotImplementedError("FROM a directory (safetensors) is not emulated")
            req.files = {**(req.files or {}), str(path): _sha256(path)}
        elif name in ("template", "system", "renderer", "parser", "requires"):
            setattr(req, name, args)
        elif name == "license":
            licenses.append(args)
        elif name == "message":
            role, _, content = args.partition(": ")
            messages.append({"role": role, "content": content})
        elif name == "adapter":
            raise NotImplementedError("ADAPTER is not emulated")
        elif name in _DEPRECATED:
            out.append(f"warning: parameter {name} is deprecated\n")
        else:
            value = format_params(name, [args])
            params[name] = params[name] + value if isinstance(value, list) and name in params else value
    req.parameters = params or None
    req.messages = messages or None
    req.license = licenses or None
    return req


# --- api.Client ---------------------------------------------------------------------------------------


@attrs.frozen
class Sent:
    """A request the CLI made: method, path, headers and body bytes (chunked uploads: None)."""

    method: str
    path: str
    headers: dict
    body: bytes | None

    def json(self):
        return json.loads(self.body)


def ollama_host(value: str) -> str:
    """envconfig.Host: OLLAMA_HOST as a base URL — http and port 11434 unless it says otherwise
    (a scheme without a port: that scheme's port)."""
    scheme, sep, hostport = value.strip().partition("://")
    default = {"http": 80, "https": 443}.get(scheme, _DEFAULT_PORT) if sep else _DEFAULT_PORT
    if not sep:
        scheme, hostport = "http", value.strip()
    hostport, _, path = hostport.partition("/")
    parts = urlsplit(f"//{hostport}")
    try:
        host, port = (parts.hostname, parts.port) if parts.port is not None else (None, None)
    except ValueError:
        host, port = None, None
    if host is None:
        host, port = (hostport.strip("[]") or "127.0.0.1"), default
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}" + (f"/{path}" if path else "")


class Client:
    def __init__(self, host: str, sent: list[Sent]):
        self.base = ollama_host(host)
        self.sent = sent
        self.http = httpx.Client(timeout=600)

    def _headers(self, accept: str) -> dict:
        # Go's transport adds Accept-Encoding: gzip (and undoes it)
        return {
            "Content-Type": "application/json",
            "Accept": accept,
            "User-Agent": USER_AGENT,
            "Accept-Encoding": "gzip",
        }

    def do(self, method: str, path: str, body=None, into: str | None = None, upload=None):
        """Client.do: the whole answer read, then checkError, then decoded `into` that struct; an
        `upload` (a file's chunks) goes chunked, as Go sends an io.Reader of unknown length."""
        content = upload if upload is not None else (None if body is None else go_json(body))
        headers = self._headers("application/json")
        self.sent.append(Sent(method, path, headers, content if isinstance(content, bytes) else None))
        r = self.http.request(method, self.base + path, content=content, headers=headers)
        raw = r.read()
        if r.status_code >= 400:
            if r.status_code == 401:
                try:
                    url = json.loads(raw).get("signin_url", "")
                except (ValueError, AttributeError):
                    url = ""
                raise AuthorizationError(401, "", url if isinstance(url, str) else "")
            try:
                parsed = json.loads(raw)
                message = decode(parsed, {"error": str}, "StatusError")["error"]
            except (ValueError, GoError):  # not JSON, or `error` not a string: the body itself
                message = raw.decode(errors="replace")
            raise StatusError(r.status_code, "", message)
        if raw and into is not None:
            try:
                return decode(json.loads(raw), STRUCTS[into], into)
            except ValueError as exc:
                raise GoError(f"invalid character in JSON: {exc}") from None
        return None

    def stream(self, method: str, path: str, body, into: str, fn) -> None:
        """Client.stream: NDJSON read line by line; a status of 400 or more fails at the first line
        with `Status` (the status line as Go's client keeps it: `<code> <reason phrase>`)."""
        content = go_json(body)
        headers = self._headers("application/x-ndjson")
        self.sent.append(Sent(method, path, headers, content))
        with self.http.stream(method, self.base + path, content=content, headers=headers) as r:
            status = f"{r.status_code} {r.reason_phrase}"
            for line in _lines(r):
                try:
                    parsed = json.loads(line)
                    error = decode(parsed, _ERROR_LINE, "errorResponse")
                except (ValueError, GoError):
                    text = line.decode(errors="replace")
                    if r.status_code >= 400:
                        raise StatusError(r.status_code, status, text) from None
                    raise GoError(text) from None
                if r.status_code == 401:
                    raise AuthorizationError(401, status, error["signin_url"])
                if r.status_code >= 400:
                    raise StatusError(r.status_code, status, error["error"])
                if error["error"]:
                    raise GoError(error["error"])
                fn(decode(parsed, STRUCTS[into], into))


def _lines(r: httpx.Response):
    """bufio.Scanner's lines: split on \\n, a trailing \\r dropped, the last line without its \\n too."""
    pending = b""
    for chunk in r.iter_bytes():
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line.removesuffix(b"\r")
    if pending:
        yield pending.removesuffix(b"\r")


# --- the request structs (api/types.go) -----------------------------------------------------------------


def show_request(name: str = "", model: str = "", system: str = "", options: dict | None = None, verbose=False):
    return {
        "model": model,
        "system": system,
        "template": "",
        "verbose": verbose,
        "options": _sorted(options),
        "name": name,
    }


def _generating(head: dict, fmt: str, keep_alive, options, think) -> dict:
    """GenerateRequest's and ChatRequest's fields after their own, as json.Marshal writes them
    (the CLI never sets stream, raw, images or tools: left out)."""
    body = dict(head)
    if fmt:
        body["format"] = json.loads(fmt)  # json.RawMessage, written as it is
    if keep_alive is not None:
        body["keep_alive"] = _duration_json(keep_alive)
    body["options"] = _sorted(options)
    if think is not None:
        body["think"] = think
    return body


def generate_request(model: str, prompt="", system="", fmt="", keep_alive=None, options=None, think=None) -> dict:
    head = {"model": model, "prompt": prompt, "suffix": "", "system": system, "template": ""}
    return _generating(head, fmt, keep_alive, options, think)


def chat_request(model: str, messages: list, fmt="", keep_alive=None, options=None, think=None) -> dict:
    return _generating({"model": model, "messages": messages}, fmt, keep_alive, options, think)


def _message(role: str, content: str, thinking: str = "") -> dict:
    return {"role": role, "content": content, **({"thinking": thinking} if thinking else {})}


def _registry_request(name: str, insecure: bool) -> dict:
    """api.PullRequest and api.PushRequest: the CLI fills only the deprecated `name`."""
    return {"model": "", **({"insecure": True} if insecure else {}), "username": "", "password": "", "name": name}


# --- the commands (cmd/cmd.go, cmd/interactive.go) ---------------------------------------------------------


@attrs.define
class Result:
    """What a command printed, its exit code, the requests it made and its progress statuses."""

    stdout: str = ""
    stderr: str = ""
    code: int = 0
    sent: list[Sent] = attrs.Factory(list)
    progress: list[str] = attrs.Factory(list)

    def rows(self) -> list[list[str]]:
        """A table the command printed (list, ps): its rows, cells split where tablewriter padded."""
        return [re.split(r" {2,}", line.strip()) for line in self.stdout.splitlines() if line.strip()]


# each command's flags: name → kind ("bool" or "string"), short forms included
_FLAGS = {
    "run": {
        "keepalive": "string",
        "verbose": "bool",
        "insecure": "bool",
        "nowordwrap": "bool",
        "format": "string",
        "think": "think",
        "hidethinking": "bool",
    },
    "show": {
        "license": "bool",
        "modelfile": "bool",
        "parameters": "bool",
        "template": "bool",
        "system": "bool",
        "verbose": "bool",
        "v": "verbose",
    },
    "create": {"file": "string", "f": "file", "quantize": "string", "q": "quantize"},
    "pull": {"insecure": "bool"},
    "push": {"insecure": "bool"},
}
_ALIASES = {"ls": "list"}


def _parse_flags(command: str, argv: list[str]) -> tuple[list[str], dict]:
    known, args, flags = _FLAGS.get(command, {}), [], {}
    it = iter(argv)
    for arg in it:
        if not arg.startswith("-") or arg == "-":
            args.append(arg)
            continue
        key, eq, value = arg.lstrip("-").partition("=")
        kind = known.get(key)
        if kind in ("verbose", "file", "quantize"):  # a short form
            key, kind = kind, known[kind]
        if kind is None:
            raise GoError(f"unknown flag: {arg}")
        if kind == "bool":
            flags[key] = value not in _GO_FALSE if eq else True
        elif kind == "think":
            flags[key] = value if eq else "true"  # NoOptDefVal
        else:
            flags[key] = value if eq else next(it, "")
    return args, flags


class _CLI:
    def __init__(self, host: str, result: Result, tty: bool, lines: list[str], stdin: str | None, older: bool):
        self.result, self.tty, self.lines, self.stdin, self.older = result, tty, list(lines), stdin, older
        self.client = Client(host, result.sent)
        self.flags: dict = {}

    def out(self, text: str) -> None:
        self.result.stdout += text

    def err(self, text: str) -> None:
        self.result.stderr += text

    def main(self, argv: list[str]) -> None:
        if not argv:
            raise GoError("no command")
        command = _ALIASES.get(argv[0], argv[0])
        args, self.flags = _parse_flags(command, argv[1:])
        handler = getattr(self, f"cmd_{command}", None)
        if handler is None:
            raise GoError(f'unknown command "{argv[0]}" for "ollama"')
        self.client.do("HEAD", "/")  # checkServerHeartbeat
        handler(args)

    # -- list, ps, show, cp, rm, stop, pull, push, create ------------------------------------------

    def cmd_list(self, args: list[str]) -> None:
        listed = self.client.do("GET", "/api/tags", into="ListResponse")
        rows = []
        for m in listed["models"]:
            if not args or m["name"].lower().startswith(args[0].lower()):
                size = "-" if m["remote_model"] else human_bytes(m["size"])
                rows.append([m["name"], _digest12(m["digest"]), size, human_time(m["modified_at"], "Never")])
        self.out(_table(["NAME", "ID", "SIZE", "MODIFIED"], rows))

    def cmd_ps(self, args: list[str]) -> None:
        running = self.client.do("GET", "/api/ps", into="ProcessResponse")
        rows = []
        for m in running["models"]:
            if args and not m["name"].startswith(args[0]):
                continue
            size, vram = m["size"], m["size_vram"]
            if vram == 0:
                processor = "100% CPU"
            elif vram == size:
                processor = "100% GPU"
            elif vram > size or size == 0:
                processor = "Unknown"
            else:
                cpu = round((size - vram) / size * 100)
                processor = f"{cpu}%/{100 - cpu}% CPU/GPU"
            expires = m["expires_at"]
            past = expires is not None and expires < datetime.datetime.now(datetime.UTC)
            until = "Stopping..." if past else human_time(expires, "Never")
            rows.append(
                [m["name"], _digest12(m["digest"]), human_bytes(size), processor, str(m["context_length"]), until]
            )
        self.out(_table(["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"], rows))

    def cmd_show(self, args: list[str]) -> None:
        chosen = [f for f in ("license", "modelfile", "parameters", "system", "template") if self.flags.get(f)]
        if len(chosen) > 1:
            raise GoError(
                "only one of '--license', '--modelfile', '--parameters', '--system', or '--template' can be specified"
            )
        verbose = bool(self.flags.get("verbose"))
        resp = self.client.do("POST", "/api/show", show_request(name=args[0], verbose=verbose), "ShowResponse")
        if chosen:
            shown = resp[chosen[0]]
            self.out(shown if chosen[0] in ("system", "template") else shown + "\n")
            return
        self.out(show_info(resp, verbose))

    def cmd_cp(self, args: list[str]) -> None:
        self.client.do("POST", "/api/copy", {"source": args[0], "destination": args[1]})
        self.out(f"copied '{args[0]}' to '{args[1]}'\n")

    def cmd_rm(self, args: list[str]) -> None:
        for name in args:
            try:
                self.load_or_unload(name, keep_alive=0)
            except GoError as exc:
                if "not found" not in str(exc).lower():
                    self.err(f"Warning: unable to stop model '{name}'\n")
            self.client.do("DELETE", "/api/delete", {"model": "", "name": name})
            self.out(f"deleted '{name}'\n")

    def cmd_stop(self, args: list[str]) -> None:
        try:
            self.load_or_unload(args[0], keep_alive=0)
        except GoError as exc:
            if "not found" in str(exc):
                raise GoError(f'couldn\'t find model "{args[0]}" to stop') from None
            raise

    def cmd_pull(self, args: list[str]) -> None:
        def progress(p: dict) -> None:
            if p["digest"] and p["completed"] == 0:
                return  # the layer's first frame: skipped by the CLI
            self.result.progress.append(p["status"])

        body = _registry_request(args[0], bool(self.flags.get("insecure")))
        self.client.stream("POST", "/api/pull", body, "ProgressResponse", progress)

    def cmd_push(self, args: list[str]) -> None:
        name = args[0]
        parts = name.split("/")
        host = parts[0] if len(parts) == 3 else "registry.ollama.ai"  # model.ParseName's default host
        if host.endswith((".ollama.ai", ".ollama.com")):
            try:
                self.client.do("POST", "/api/me", into="UserResponse")  # client.Whoami
            except AuthorizationError as exc:
                self.out("You need to be signed in to push models to ollama.com.\n\n")
                if exc.signin_url:
                    self.out(f"To sign in, navigate to:\n    {exc.signin_url}\n\n")
                return
        body = _registry_request(name, bool(self.flags.get("insecure")))
        try:
            self.client.stream(
                "POST", "/api/push", body, "ProgressResponse", lambda p: self.result.progress.append(p["status"])
            )
        except GoError as exc:
            text = str(exc).lower()
            if "access denied" in text or "unauthorized" in text:
                raise GoError(
                    "you are not authorized to push to this namespace, create the model under a namespace you own"
                ) from None
            raise
        raise NotImplementedError("what the CLI prints after a push that succeeds (greenroom refuses every push)")

    def cmd_create(self, args: list[str]) -> None:
        filename = Path(self.flags.get("file") or "Modelfile").resolve()
        if not filename.exists():
            raise GoError("specified Modelfile wasn't found")
        notes: list[str] = []
        req = create_request(parse_modelfile(filename.read_text()), filename.parent, notes)
        self.out("".join(notes))
        req.model = args[0]
        req.quantize = self.flags.get("quantize", "")
        uploaded = {}
        for path, digest in (req.files or {}).items():
            self.create_blob(Path(path), digest)
            uploaded[Path(path).name] = digest  # the CLI keeps the file's base name only
        req.files = uploaded or None
        try:
            self.client.stream(
                "POST",
                "/api/create",
                req.body(),
                "ProgressResponse",
                lambda p: self.result.progress.append(p["status"]),
            )
        except GoError as exc:
            if "path or Modelfile are required" in str(exc):
                raise GoError("the ollama server must be updated to use `ollama create` with this client") from None
            raise

    def create_blob(self, path: Path, digest: str) -> None:
        """client.CreateBlob: POST /api/blobs/<digest> with the file's bytes; older CLIs ask
        HEAD first and upload only on a 404."""
        if self.older:
            try:
                self.client.do("HEAD", f"/api/blobs/{digest}")
                return
            except StatusError as exc:
                if exc.status_code != 404:
                    raise

        def chunks():
            with open(path.resolve(), "rb") as f:
                yield from iter(lambda: f.read(1 << 20), b"")

        self.client.do("POST", f"/api/blobs/{digest}", upload=chunks())

    # -- run -----------------------------------------------------------------------------------

    def load_or_unload(self, model: str, keep_alive=None, think=None) -> None:
        """loadOrUnloadModel: show (a cloud model is not loaded), then an empty generate."""
        info = self.client.do("POST", "/api/show", show_request(model=model), "ShowResponse")
        if info["remote_host"]:
            return
        self.client.stream(
            "POST",
            "/api/generate",
            generate_request(model, keep_alive=keep_alive, think=think),
            "GenerateResponse",
            lambda _: None,
        )

    def cmd_run(self, args: list[str]) -> None:
        opts = _RunOptions(model=args[0], fmt=self.flags.get("format", ""))
        if "think" in self.flags:
            think = self.flags["think"]
            if think not in ("", "true", "false", "high", "medium", "low"):
                raise GoError(f'invalid value for --think: "{think}" (must be true, false, high, medium, or low)')
            opts.think = think if think in ("high", "medium", "low") else think != "false"
        opts.hide_thinking = bool(self.flags.get("hidethinking"))
        if self.flags.get("keepalive"):
            opts.keep_alive = parse_duration(self.flags["keepalive"])
        prompts, interactive = args[1:], True
        if not self.tty:  # stdin is not a terminal: read and prepended; nor is stdout: not interactive
            if self.stdin:
                prompts = [self.stdin, *prompts]
            interactive = False
        opts.prompt = " ".join(prompts)
        interactive = interactive and not prompts
        info = self.show_or_pull(args[0])
        if opts.think is None and "thinking" in info["capabilities"]:  # inferThinkingOption
            opts.think = True
        if "embedding" in info["capabilities"] or "image" in info["capabilities"]:
            raise NotImplementedError("embedding and image generation models are not emulated")
        if not interactive:
            self.generate(opts)
            return
        self.load_or_unload(opts.model, opts.keep_alive, opts.think)
        for m in info["messages"] or ():
            if m["role"] == "user":
                self.out(f">>> {m['content']}\n")
            elif m["role"] == "assistant":
                self.out(m["content"] + "\n\n")
        self.interactive(opts)

    def show_or_pull(self, name: str) -> dict:
        try:
            return self.client.do("POST", "/api/show", show_request(name=name), "ShowResponse")
        except StatusError as exc:
            if exc.status_code != 404:
                raise
        self.cmd_pull([name])
        return self.client.do("POST", "/api/show", show_request(name=name), "ShowResponse")

    def generate(self, opts: _RunOptions) -> None:
        latest: dict = {}
        shown = _Thinking(self, hide=opts.hide_thinking)

        def fn(resp: dict) -> None:
            nonlocal latest
            latest = resp
            shown.feed(resp["thinking"], resp["response"], resp["tool_calls"])
            self.out(resp["response"])
            if resp["tool_calls"]:
                self.out(_tool_calls(resp["tool_calls"]))

        body = generate_request(
            opts.model, opts.prompt, opts.system, _quoted(opts.fmt), opts.keep_alive, dict(opts.options), opts.think
        )
        self.client.stream("POST", "/api/generate", body, "GenerateResponse", fn)
        if opts.prompt:
            self.out("\n\n")
        if latest.get("done") and self.flags.get("verbose"):
            self.err(summary(latest))

    def chat(self, opts: _RunOptions) -> dict:
        latest: dict = {}
        role, content, thinking = "assistant", [], []
        shown = _Thinking(self, hide=opts.hide_thinking)

        def fn(resp: dict) -> None:
            nonlocal latest, role
            latest, role = resp, resp["message"]["role"]
            msg = resp["message"]
            if msg["thinking"] and not opts.hide_thinking:
                thinking.append(msg["thinking"])
            shown.feed(msg["thinking"], msg["content"], msg["tool_calls"])
            content.append(msg["content"])
            if msg["tool_calls"]:
                self.out(_tool_calls(msg["tool_calls"]))
            self.out(msg["content"])

        body = chat_request(
            opts.model, opts.messages, _quoted(opts.fmt), opts.keep_alive, dict(opts.options), opts.think
        )
        self.client.stream("POST", "/api/chat", body, "ChatResponse", fn)
        if opts.messages:
            self.out("\n\n")
        if latest and self.flags.get("verbose"):
            self.err(summary(latest))
        return _message(role, "".join(content), "".join(thinking))

    def interactive(self, opts: _RunOptions) -> None:
        """generateInteractive: each line as typed at `>>> `."""
        while self.lines:
            line = self.lines.pop(0)
            self.out(f">>> {line}\n")
            words = line.split()
            if line.startswith(("/exit", "/bye")):
                return
            if line.startswith("/set"):
                self.set_command(opts, words)
                continue
            if line.startswith("/show"):
                self.show_command(opts, words)
                continue
            if line.startswith("/clear"):
                opts.messages = [_message("system", opts.system)] if opts.system else []
                self.out("Cleared session context\n")
                continue
            if line.startswith("/list"):
                self.cmd_list(words[1:])
                continue
            if line.startswith(("/load", "/save")):
                raise NotImplementedError("/load and /save are not emulated")
            if line.startswith(("/help", "/?")):
                continue  # usage, on stderr
            if line.startswith("/"):
                self.out(f"Unknown command '{words[0]}'. Type /? for help\n")
                continue
            opts.messages.append(_message("user", line))
            try:
                assistant = self.chat(opts)
            except GoError as exc:
                if "does not support thinking" in str(exc) or "invalid think value" in str(exc):
                    self.out(f"error: {exc}\n")
                    continue
                raise
            opts.messages.append(assistant)
        self.out("\n")  # Ctrl-D

    def set_command(self, opts: _RunOptions, words: list[str]) -> None:
        what = words[1] if len(words) > 1 else ""
        if what in ("think", "nothink"):
            level = words[2] if what == "think" and len(words) > 2 else ""
            opts.think = level or what == "think"
            shown = self.client.do("POST", "/api/show", show_request(model=opts.model), "ShowResponse")
            if "thinking" not in shown["capabilities"]:  # ensureThinkingSupport
                self.err(f'warning: model "{opts.model}" does not support thinking output\n')
            self.out(f"Set 'think' mode to '{level}'.\n" if level else f"Set '{what}' mode.\n")
        elif what in ("verbose", "quiet"):
            self.flags["verbose"] = what == "verbose"
            self.out(f"Set '{what}' mode.\n")
        elif what == "format":
            if len(words) < 3 or words[2] != "json":
                self.out("Invalid or missing format. For 'json' mode use '/set format json'\n")
            else:
                opts.fmt = "json"
                self.out("Set format to 'json' mode.\n")
        elif what == "noformat":
            opts.fmt = ""
            self.out("Disabled format.\n")
        elif what in ("parameter", "system") and len(words) < (4 if what == "parameter" else 3):
            return  # usage, on stderr
        elif what == "parameter":
            try:
                opts.options[words[2]] = format_params(words[2], words[3:])
            except GoError as exc:
                self.out(f"Couldn't set parameter: {json.dumps(str(exc))}\n")
                return
            self.out(f"Set parameter '{words[2]}' to '{', '.join(words[3:])}'\n")
        elif what == "system":
            opts.system = " ".join(words[2:])
            message = _message("system", opts.system)
            if opts.messages and opts.messages[-1]["role"] == "system":
                opts.messages[-1] = message
            else:
                opts.messages.append(message)
            self.out("Set system message.\n")
        elif what in ("wordwrap", "nowordwrap"):
            self.out(f"Set '{what}' mode.\n")
        elif what in ("history", "nohistory"):
            pass  # readline's history: nothing printed
        elif what:
            self.out(f"Unknown command '/set {what}'. Type /? for help\n")

    def show_command(self, opts: _RunOptions, words: list[str]) -> None:
        if len(words) < 2:
            return  # usage, on stderr
        try:
            resp = self.client.do(
                "POST",
                "/api/show",
                show_request(name=opts.model, system=opts.system, options=opts.options),
                "ShowResponse",
            )
        except GoError:
            self.out("error: couldn't get model\n")
            raise
        what = words[1]
        if what == "info":
            self.err(show_info(resp, False))
        elif what == "license":
            self.out((resp["license"] or "No license was specified for this model.") + "\n")
        elif what == "modelfile":
            self.out(resp["modelfile"] + "\n")
        elif what == "parameters":
            self.out("Model defined parameters:\n")
            if resp["parameters"]:
                self.out("".join(f"  {line}\n" for line in resp["parameters"].split("\n")))
            else:
                self.out("  No additional parameters were specified for this model.\n")
            self.out("\n")
            if opts.options:
                self.out("User defined parameters:\n")
                self.out("".join(f"  {k:<30} {_go_v(v)}\n" for k, v in opts.options.items()) + "\n")
        elif what == "system":
            system = opts.system or resp["system"]
            self.out(system + "\n\n" if system else "No system message was specified for this model.\n")
        elif what == "template":
            self.out((resp["template"] or "No prompt template was specified for this model.") + "\n")
        else:
            self.out(f"Unknown command '/show {what}'. Type /? for help\n")


@attrs.define
class _RunOptions:
    model: str
    fmt: str = ""
    prompt: str = ""
    system: str = ""
    messages: list = attrs.Factory(list)
    options: dict = attrs.Factory(dict)
    keep_alive: int | None = None
    think: bool | str | None = None
    hide_thinking: bool = False


class _Thinking:
    """The "Thinking..." block the CLI prints around a model's thinking."""

    def __init__(self, cli: _CLI, hide: bool):
        self.cli, self.hide, self.open, self.text = cli, hide, False, ""

    def feed(self, thinking: str, content: str, tool_calls) -> None:
        if thinking and not self.hide:
            if not self.open:
                self.cli.out("Thinking...\n")
                self.open = True
            self.text += thinking
            self.cli.out(thinking)
        if self.open and (content or tool_calls):
            self.cli.out(("" if self.text.endswith("\n") else "\n") + "...done thinking.\n\n")
            self.open = False


def _quoted(fmt: str) -> str:
    """The CLI quotes `--format json` into the raw JSON string `"json"`."""
    return f'"{fmt}"' if fmt == "json" else fmt


def _tool_calls(calls: list[dict]) -> str:
    return "\n".join(
        f"  Model called a non-existent function '{c['function']['name']}()' with arguments: "
        + go_json(c["function"]["arguments"] or {}).decode()
        for c in calls
    )


def _digest12(digest: str) -> str:
    if len(digest) < 12:
        raise GoPanic(f"runtime error: slice bounds out of range [:12] with length {len(digest)}")
    return digest[:12]


def summary(metrics: dict) -> str:
    """api.Metrics.Summary (stderr)."""
    out = []
    if metrics["total_duration"] > 0:
        out.append(f"total duration:       {go_duration(metrics['total_duration'])}")
    if metrics["load_duration"] > 0:
        out.append(f"load duration:        {go_duration(metrics['load_duration'])}")
    if metrics["prompt_eval_count"] > 0:
        out.append(f"prompt eval count:    {metrics['prompt_eval_count']} token(s)")
    if metrics["prompt_eval_duration"] > 0:
        out.append(f"prompt eval duration: {go_duration(metrics['prompt_eval_duration'])}")
        rate = metrics["prompt_eval_count"] / (metrics["prompt_eval_duration"] / 1e9)
        out.append(f"prompt eval rate:     {rate:.2f} tokens/s")
    if metrics["eval_count"] > 0:
        out.append(f"eval count:           {metrics['eval_count']} token(s)")
    if metrics["eval_duration"] > 0:
        out.append(f"eval duration:        {go_duration(metrics['eval_duration'])}")
        out.append(f"eval rate:            {metrics['eval_count'] / (metrics['eval_duration'] / 1e9):.2f} tokens/s")
    return "".join(line + "\n" for line in out)


def _table(header: list[str], rows: list[list[str]]) -> str:
    """tablewriter as the CLI sets it up: no borders, left-aligned, cells padded by four spaces."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "".join("".join(c.ljust(w) + "    " for c, w in zip(r, widths, strict=True)) + "\n" for r in [header, *rows])


def _go_g(value: float) -> str:
    """fmt's %g (and %v) of a float64: its shortest digits, in exponent form when the exponent is
    below -4 or from 6 up (strconv's rule for the shortest precision: 1e+06, 32768)."""
    if value == 0:
        return "0"
    sign, digits, exp = decimal.Decimal(repr(float(value))).normalize().as_tuple()
    mantissa, point = "".join(map(str, digits)), len(digits) + exp - 1
    minus = "-" if sign else ""
    if point < -4 or point >= 6:
        fraction = "." + mantissa[1:] if len(mantissa) > 1 else ""
        return f"{minus}{mantissa[0]}{fraction}e{'-' if point < 0 else '+'}{abs(point):02d}"
    return minus + format(decimal.Decimal(repr(abs(float(value)))).normalize(), "f")


def _go_any(value) -> str:
    """fmt's %v of a decoded JSON value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _go_g(value)
    if isinstance(value, list):
        return "[" + " ".join(_go_any(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_any(value[k])}" for k in sorted(value)) + "]"
    return "<nil>" if value is None else str(value)


def _metadata_value(value) -> str:
    """A `model_info` value as showInfo's Metadata table prints it: a list cut to what fits in
    ten columns, with how many more; any other type its Go type's name."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return _go_g(value)
    if isinstance(value, list):
        shown, width = 0, 1
        for i, item in enumerate(value):
            w = len(_go_any(item)) + (2 if i else 0)
            if width + w > 10 and i > 0:
                break
            width, shown = width + w, shown + 1
        if shown < len(value):
            return _go_any(value[:shown]).removesuffix("]") + f" ...+{len(value) - shown} more]"
        return _go_any(value)
    return "map[string]interface {}" if isinstance(value, dict) else "<nil>"


def show_info(resp: dict, verbose: bool) -> str:
    """showInfo: the Model, Capabilities, Parameters, (Metadata), System and License tables."""
    out: list[str] = []

    def table(title: str, rows: list[list[str]]) -> None:
        out.append(f"  {title}\n")
        if rows:
            widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(max(len(r) for r in rows))]
            for r in rows:
                out.append("".join(c.ljust(w) + "    " for c, w in zip(r, widths, strict=False)) + "\n")
        out.append("\n")

    info, details = resp["model_info"], resp["details"]
    rows = []
    if resp["remote_host"]:
        rows += [["", "Remote model", resp["remote_model"]], ["", "Remote URL", resp["remote_host"]]]
    if info is not None:
        arch = info.get("general.architecture")
        if not isinstance(arch, str):
            held = "nil" if arch is None else type(arch).__name__
            raise GoPanic(f"interface conversion: interface {{}} is {held}, not string")
        rows.append(["", "architecture", arch])
        params = details["parameter_size"]
        count = info.get("general.parameter_count")
        if not params and isinstance(count, (int, float)) and not isinstance(count, bool):
            params = human_number(int(count))
        rows.append(["", "parameters", params])
        for key, label in (
            (f"{arch}.context_length", "context length"),
            (f"{arch}.embedding_length", "embedding length"),
        ):
            value = info.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append(["", label, _float_text(float(value))])
    else:
        rows += [["", "architecture", details["family"]], ["", "parameters", details["parameter_size"]]]
    rows.append(["", "quantization", details["quantization_level"]])
    if resp["requires"]:
        rows.append(["", "requires", resp["requires"]])
    table("Model", rows)
    if resp["capabilities"]:
        table("Capabilities", [["", c] for c in resp["capabilities"]])
    if resp["parameters"]:
        table("Parameters", [["", *line.split()] for line in resp["parameters"].splitlines() if line])
    if info is not None and verbose:
        table("Metadata", [["", k, _metadata_value(info[k])] for k in sorted(info)])

    def head(text: str, n: int) -> list[list[str]]:
        lines = [t.strip() for t in text.splitlines() if t.strip()]
        return [["", t] for t in lines[:n]] + ([["", "..."]] if len(lines) > n else [])

    if resp["system"]:
        table("System", head(resp["system"], 2))
    if resp["license"]:
        table("License", head(resp["license"], 2))
    return "".join(out)


def ollama(
    host: str, *argv: str, tty: bool = False, lines: tuple[str, ...] = (), stdin: str | None = None, older: bool = False
) -> Result:
    """Run `ollama <argv>` with OLLAMA_HOST=`host`. `tty`: stdin and stdout are a terminal and
    `lines` are typed at `ollama run`'s prompt (otherwise `stdin` is piped in and the output is not
    a terminal, so `run` answers once). `older`: a CLI that asks HEAD /api/blobs before uploading."""
    result = Result()
    cli = _CLI(host, result, tty, list(lines), stdin, older)
    try:
        cli.main(list(argv))
    except GoPanic as exc:
        result.stderr += f"panic: {exc}\n"
        result.code = 2
    except GoError as exc:
        result.stderr += f"Error: {exc}\n"
        result.code = 1
    finally:
        cli.client.http.close()
    return result
