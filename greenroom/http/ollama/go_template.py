"""Go's text/template, the part of it Ollama's templates use, with Go's semantics: parsed once
(`parse`), executed on Go-shaped values (`Template.execute`). Pure: no I/O, no greenroom state.

Rendered as Go renders them: text with `{{- ` / ` -}}` trimming and `{{/* comments */}}`;
actions printing a pipeline (`|` chains, the piped value last); `if` / `else if` / `else`,
`range` (over slices and maps — a map's keys in sorted order — with `$i, $e :=`, `break`,
`continue`, `else`), `with` / `else with`; variables (`$x := …`, `$x = …`, `$` the data);
fields (`.A.B`, `$x.A`, `(pipeline).A`); literals (strings, raw strings, numbers, characters,
`true`, `false`, `nil`); the functions `and` and `or` (lazily, returning an operand), `not`,
`len`, `index`, `slice`, `eq` (against several), `ne`, `lt`, `le`, `gt`, `ge`, `print`,
`println`, `printf` (verbs %s %v %d %%), and those a FuncMap adds (`parse`'s `functions`);
methods that take no argument (`Struct.methods`). Go's truth: false, 0, nil and
empty strings, slices and maps are false; a struct is true. A map's missing key is Go's zero
`any`: false, and printed `<no value>`.

Refused, naming the construct (TemplateError.construct): `define`, `template`, `block`, the
functions `call`, `html`, `js` and `urlquery`, other printf verbs, and printing a struct that
has no String method. A template Go would not parse, and an execution Go would
fail, raise TemplateError with Go's reason.

Values: str, bool, int, float, None (nil), MISSING (a missing key), lists and dicts (Go's
[]any and map[string]any), and `Slice`, `Map`, `Struct` for typed Go values: a Struct's fields
by Go name, its JSON encoding by its tags, and its String method if it has one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import attrs

# --- values ----------------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()  # Go's invalid value: what a map answers for a key it lacks


class Slice(list):
    """A typed Go slice: `nil` (null in JSON, but len 0 and false like an empty one) and the
    String method of its type, if it has one."""

    def __init__(self, items=(), nil: bool = False, string: Callable[[Slice], str] | None = None):
        super().__init__(items)
        self.nil = nil
        self.string = string


class Map(dict):
    """A typed Go map that keeps its order (Ollama's ordered maps): encoded in JSON in the
    order it was built, ranged in key order as Go ranges a map; and the String method of its
    type, if it has one. (A plain dict, Go's map[string]any, is encoded in key order.)"""

    def __init__(self, items=(), string: Callable[[Map], str] | None = None):
        super().__init__(items)
        self.string = string


@attrs.frozen(eq=False)
class Struct:
    """A Go struct value. `tags`: (Go field, JSON key, omitempty) in declaration order;
    `string` its String method, `methods` its other methods that take no argument."""

    type: str
    fields: dict
    tags: tuple[tuple[str, str, bool], ...]
    string: Callable[[Struct], str] | None = None
    methods: dict[str, Callable[[Struct], object]] = attrs.field(factory=dict)

    def replace(self, **changes) -> Struct:
        return attrs.evolve(self, fields={**self.fields, **changes})


class TemplateError(Exception):
    """`construct`: the Go construct greenroom refuses to render (None: Go's own error)."""

    def __init__(self, message: str, construct: str | None = None):
        super().__init__(message)
        self.construct = construct


def truth(v) -> bool:
    """Go's text/template truth."""
    if v is None or v is MISSING:
        return False
    if isinstance(v, Struct):
        return True
    if isinstance(v, bool | int | float):
        return v != 0
    return len(v) > 0


# --- nodes -----------------------------------------------------------------------------------


@attrs.frozen
class Text:
    text: str


@attrs.frozen
class Field:  # .A.B (on dot)
    idents: tuple[str, ...]


@attrs.frozen
class Variable:  # $x.A.B ($ alone: the data)
    name: str
    idents: tuple[str, ...] = ()


@attrs.frozen
class Chain:  # (pipeline).A.B
    node: object
    idents: tuple[str, ...]


@attrs.frozen
class Identifier:  # a function's name
    name: str


@attrs.frozen
class Literal:  # a string, number, character, true, false or nil
    value: object
    source: str


@attrs.frozen
class Dot:
    pass


@attrs.frozen
class Command:
    args: tuple


@attrs.frozen
class Pipe:
    decl: tuple[str, ...]  # the variables it declares or assigns
    assign: bool  # `=` (assigns) rather than `:=` (declares)
    cmds: tuple[Command, ...]
    line: int


@attrs.frozen
class Action:
    pipe: Pipe


@attrs.frozen
class Branch:  # if, range, with
    kind: str
    pipe: Pipe
    body: tuple
    orelse: tuple | None


@attrs.frozen
class Break:
    pass


@attrs.frozen
class Continue:
    pass


# --- lexing and parsing ----------------------------------------------------------------------

_SPACE = " \t\r\n"
_SPACES = re.compile(r"[ \t\r\n]*")
# greenroom's bounds on what one template may cost (Go has none): its nesting, and one
# execution's steps (nodes run, range iterations) and output
MAX_DEPTH = 100
MAX_STEPS = 1_000_000
MAX_OUTPUT = 16 * 1024 * 1024
_TOKEN = re.compile(
    r"""(?P<declare>:=)
      | (?P<punct>[()|,=])
      | (?P<string>"(?:[^"\\\n]|\\.)*")
      | (?P<raw>`[^`]*`)
      | (?P<char>'(?:[^'\\\n]|\\.[^']*)')
      | (?P<number>[+-]?(?:0[xX][0-9a-fA-F_]*\.?[0-9a-fA-F_]*[pP][+-]?[0-9_]+|0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+
                        |[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9_]+)?|\.[0-9][0-9_]*(?:[eE][+-]?[0-9_]+)?)i?)
      | (?P<field>\.[A-Za-z_][A-Za-z0-9_]*)
      | (?P<dot>\.)
      | (?P<variable>\$[A-Za-z0-9_]*)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.DOTALL)
_REFUSED_FUNCTIONS = frozenset({"call", "html", "js", "urlquery"})
_REFUSED_KEYWORDS = frozenset({"define", "template", "block"})


def _unquote(body: str, line: int) -> str:
    def one(m: re.Match) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0].isdigit():
            return chr(int(e, 8))
        if e in _ESCAPES:
            return _ESCAPES[e]
        raise TemplateError(f"line {line}: unknown escape sequence \\{e}")

    return _ESCAPE.sub(one, body)


def _number(text: str, line: int):
    if text.endswith("i"):
        raise TemplateError(f"line {line}: the complex number {text}", construct="a complex number")
    digits = text.replace("_", "")
    try:
        if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F]+|[+-]?0[bB][01]+|[+-]?0[oO][0-7]+", digits):
            value = int(digits, 0)
        elif re.fullmatch(r"[+-]?0[0-7]+", digits):
            value = int(digits, 8)
        elif re.fullmatch(r"[+-]?[0-9]+", digits):
            value = int(digits)
        elif re.fullmatch(r"[+-]?0[xX].*", digits):  # a hexadecimal float
            return float.fromhex(digits)
        else:
            return float(digits)
    except (ValueError, OverflowError):
        raise TemplateError(f"line {line}: bad number syntax: {text!r}") from None
    if not -(2**63) <= value < 2**63:
        raise TemplateError(f"line {line}: {text} overflows int")
    return value


class _Parser:
    """Go's text/template/parse, for one template (no `define`)."""

    def __init__(self, text: str, functions):
        self.text = text
        self.functions = functions
        self.tokens: list[tuple[str, str, bool]] = []  # (kind, text, spaced before)
        self.at = 0
        self.line = 1
        self.scopes: list[list[str]] = [["$"]]
        self.ranges = 0
        self.depth = 0  # of branches and parentheses, bounded (MAX_DEPTH)

    # the template's items: ("text", str) and ("action", tokens, line)
    def items(self):
        text, pos, out = self.text, 0, []
        trim_next = False
        line, counted = 1, 0
        while True:
            start = text.find("{{", pos)
            chunk = text[pos : len(text) if start < 0 else start]
            if trim_next:
                chunk = chunk.lstrip(_SPACE)
            if start < 0:
                out.append(("text", chunk))
                return out
            inner = start + 2
            if text.startswith("-", inner) and inner + 1 < len(text) and text[inner + 1] in _SPACE:
                chunk = chunk.rstrip(_SPACE)
                inner += 2
            out.append(("text", chunk))
            line, counted = line + text.count("\n", counted, start), start
            if text.startswith("/*", inner):
                end = text.find("*/", inner + 2)
                if end < 0:
                    raise TemplateError(f"line {line}: unclosed comment")
                trim_next = text[end + 2 : end + 3] in tuple(_SPACE) and text.startswith("-}}", end + 3)
                if not trim_next and not text.startswith("}}", end + 2):
                    raise TemplateError(f"line {line}: comment ends before closing delimiter")
                pos = end + (6 if trim_next else 4)
                continue
            tokens, pos, trim_next = self._action(inner, line)
            out.append(("action", tokens, line))

    def _action(self, pos: int, line: int):
        """The tokens of the action at `pos`, where the text resumes, and whether its `-}}`
        trims the text after it."""
        text, tokens, spaced = self.text, [], True
        while True:
            if text.startswith("}}", pos):
                return tokens, pos + 2, False
            if pos < len(text) and text[pos] in _SPACE:
                run = _SPACES.match(text, pos).end()
                if text.startswith("-}}", run):
                    return tokens, run + 3, True
                pos, spaced = run, True
                continue
            m = _TOKEN.match(text, pos)
            if m is None:
                if pos >= len(text):
                    raise TemplateError(f"line {line}: unclosed action")
                raise TemplateError(f"line {line}: unexpected {text[pos]!r} in command")
            tokens.append((m.lastgroup, m.group(), spaced))
            spaced = False
            pos = m.end()

    # --- the tree
    def parse(self) -> tuple:
        items = self.items()
        self.items_, self.i = items, 0
        body, end = self._list(top=True)
        return body

    def _list(self, top: bool = False):
        """Nodes until {{end}} or {{else …}}: (nodes, the keyword that ended them and its tokens)."""
        nodes = []
        while self.i < len(self.items_):
            item = self.items_[self.i]
            self.i += 1
            if item[0] == "text":
                if item[1]:
                    nodes.append(Text(item[1]))
                continue
            self.tokens, self.at, self.line = item[1], 0, item[2]
            if not self.tokens:
                raise TemplateError(f"line {self.line}: missing value for command")
            kind, word, _ = self.tokens[0]
            if kind == "ident" and word in ("end", "else"):
                if top:
                    raise TemplateError(f"line {self.line}: unexpected {{{{{word}}}}}")
                self.at = 1
                return tuple(nodes), word
            nodes.append(self._action_node(kind, word))
        if not top:
            raise TemplateError(f"line {self.line}: unexpected EOF")
        return tuple(nodes), None

    def _action_node(self, kind: str, word: str):
        if kind == "ident" and word in _REFUSED_KEYWORDS:
            raise TemplateError(f"line {self.line}: {{{{{word}}}}} is not rendered", construct=word)
        if kind == "ident" and word in ("if", "range", "with"):
            self.at = 1
            return self._branch(word)
        if kind == "ident" and word in ("break", "continue"):
            if not self.ranges:
                raise TemplateError(f"line {self.line}: {{{{{word}}}}} outside {{{{range}}}}")
            self._done(1)
            return Break() if word == "break" else Continue()
        return Action(self._pipe(declare=True))

    def _deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise TemplateError(f"line {self.line}: nested deeper than {MAX_DEPTH} (greenroom's limit)")

    def _branch(self, kind: str) -> Branch:
        self._deeper()
        self.scopes.append([])
        pipe = self._pipe(declare=True, range_decl=kind == "range")
        self.ranges += kind == "range"
        body, end = self._list()
        self.ranges -= kind == "range"
        orelse = None
        if end == "else":
            if kind != "range" and self.at < len(self.tokens) and self.tokens[self.at][1] in ("if", "with"):
                chained = self.tokens[self.at][1]
                if chained != kind:
                    raise TemplateError(f"line {self.line}: {{{{else {chained}}}}} in {{{{{kind}}}}}")
                self.at += 1
                orelse = (self._branch(kind),)  # shares this one's {{end}}
                self.scopes.pop()
                self.depth -= 1
                return Branch(kind, pipe, body, orelse)
            self._done(self.at)
            orelse, end = self._list()
            if end != "end":
                raise TemplateError(f"line {self.line}: expected end; found {{{{else}}}}")
        else:
            self._done(self.at)
        self.scopes.pop()
        self.depth -= 1
        return Branch(kind, pipe, body, orelse)

    def _done(self, at: int) -> None:
        if at != len(self.tokens):
            raise TemplateError(f"line {self.line}: unexpected {self.tokens[at][1]!r} in action")

    def _peek(self, offset: int = 0):
        j = self.at + offset
        return self.tokens[j] if j < len(self.tokens) else ("eof", "", True)

    def _pipe(self, declare: bool, range_decl: bool = False, closing: str | None = None) -> Pipe:
        decl, assign = [], False
        if declare and self._peek()[0] == "variable":
            names = [self._peek()[1]]
            ahead = 1
            if range_decl and self._peek(1)[1] == "," and self._peek(2)[0] == "variable":
                names.append(self._peek(2)[1])
                ahead = 3
            op = self._peek(ahead)
            if op[0] == "declare" or (op[1] == "=" and len(names) == 1):
                assign = op[1] == "="
                self.at += ahead + 1
                decl = names
                if assign and not self._defined(names[0]):
                    raise TemplateError(f"line {self.line}: undefined variable {names[0]!r}")
        cmds = []
        while True:
            cmds.append(self._command())
            kind, word, _ = self._peek()
            if word == "|":
                self.at += 1
                continue
            break
        if closing is None:
            self._done(self.at)
        if not assign:
            self.scopes[-1].extend(decl)  # declared from here on
        return Pipe(tuple(decl), assign, tuple(cmds), self.line)

    def _defined(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def _command(self) -> Command:
        args = []
        while True:
            kind, word, _ = self._peek()
            if kind == "eof" or word in ("|", ")"):
                break
            args.append(self._operand())
        if not args:
            raise TemplateError(f"line {self.line}: missing command")
        return Command(tuple(args))

    def _operand(self):
        node = self._term()
        idents = []
        while self._peek()[0] == "field" and not self._peek()[2]:
            idents.append(self._peek()[1][1:])
            self.at += 1
        if not idents:
            return node
        if isinstance(node, Field):
            return Field(node.idents + tuple(idents))
        if isinstance(node, Variable):
            return Variable(node.name, node.idents + tuple(idents))
        if isinstance(node, Literal | Dot):
            raise TemplateError(f"line {self.line}: unexpected . after term {self.tokens[self.at - 1][1]!r}")
        return Chain(node, tuple(idents))

    def _term(self):
        kind, word, _ = self._peek()
        self.at += 1
        if kind == "field":
            return Field((word[1:],))
        if kind == "dot":
            return Dot()
        if kind == "variable":
            if not self._defined(word):
                raise TemplateError(f"line {self.line}: undefined variable {word!r}")
            return Variable(word)
        if kind == "string":
            return Literal(_unquote(word[1:-1], self.line), word)
        if kind == "raw":
            return Literal(word[1:-1].replace("\r", ""), word)
        if kind == "char":
            value = _unquote(word[1:-1], self.line)
            if len(value) != 1:
                raise TemplateError(f"line {self.line}: malformed character constant: {word}")
            return Literal(ord(value), word)
        if kind == "number":
            return Literal(_number(word, self.line), word)
        if kind == "punct" and word == "(":
            self._deeper()
            pipe = self._pipe(declare=True, closing=")")
            if self._peek()[1] != ")":
                raise TemplateError(f"line {self.line}: unclosed left paren")
            self.at += 1
            self.depth -= 1
            return pipe
        if kind == "ident":
            if word in ("true", "false"):
                return Literal(word == "true", word)
            if word == "nil":
                return Literal(None, word)
            if word in _REFUSED_FUNCTIONS:
                raise TemplateError(f"line {self.line}: the function {word!r} is not rendered", construct=word)
            if word in _REFUSED_KEYWORDS or word in ("if", "range", "with", "end", "else", "break", "continue"):
                raise TemplateError(f"line {self.line}: unexpected {word!r} in operand")
            if word not in self.functions:
                raise TemplateError(f'line {self.line}: function "{word}" not defined')
            return Identifier(word)
        raise TemplateError(f"line {self.line}: unexpected {word or 'end of action'!r} in operand")


# --- printing and JSON, as Go's fmt and encoding/json write them ----------------------------


def _float_digits(f: float) -> tuple[str, int]:
    """The shortest digits that read back as `f` (> 0) and the decimal point's position: f is
    0.<digits> × 10**point."""
    mantissa, _, exp = repr(f).partition("e")  # repr: the shortest digits, as Go's
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))  # less the zeros stripped
    return digits.rstrip("0") or "0", point


def _positional(digits: str, point: int) -> str:
    if point <= 0:
        return "0." + "0" * -point + digits
    if point >= len(digits):
        return digits + "0" * (point - len(digits))
    return digits[:point] + "." + digits[point:]


def _exponential(digits: str, point: int, pad: int) -> str:
    exp = point - 1
    head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{head}e{'-' if exp < 0 else '+'}{abs(exp):0{pad}d}"


def go_float(f: float, json: bool = False) -> str:
    """A float64 as fmt's %v (strconv 'g', shortest) or encoding/json writes it."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    sign = "-" if math.copysign(1, f) < 0 else ""
    if f == 0:
        return sign + "0"
    digits, point = _float_digits(abs(f))
    if json:
        if 1e-6 <= abs(f) < 1e21:
            return sign + _positional(digits, point)
        return sign + _exponential(digits, point, 1)
    if point - 1 < -4 or point - 1 >= 6:  # strconv's 'g' at its shortest
        return sign + _exponential(digits, point, 2)
    return sign + _positional(digits, point)


def _json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t\b\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}[ch])
        elif o < 0x20 or ch in "<>&" or o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o <= 0xDFFF:  # a lone surrogate: not UTF-8, Go writes U+FFFD
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out) + '"'


def _empty(v) -> bool:  # encoding/json's omitempty
    if v is None or v is MISSING or v is False:
        return True
    if isinstance(v, Struct) or v is True:
        return False
    if isinstance(v, int | float):
        return v == 0
    return len(v) == 0


def go_json(v) -> str:
    """`v` as Go's json.Marshal writes it (HTML characters escaped, as Go does)."""
    if v is None or v is MISSING:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v, json=True)
    if isinstance(v, str):
        return _json_string(v)
    if isinstance(v, Struct):
        parts = [
            f"{_json_string(key)}:{go_json(v.fields[name])}"
            for name, key, omitempty in v.tags
            if not (omitempty and _empty(v.fields[name]))
        ]
        return "{" + ",".join(parts) + "}"
    if isinstance(v, list):
        return "null" if isinstance(v, Slice) and v.nil else "[" + ",".join(go_json(x) for x in v) + "]"
    keys = list(v) if isinstance(v, Map) else sorted(v)
    return "{" + ",".join(f"{_json_string(str(k))}:{go_json(v[k])}" for k in keys) + "}"


def _sprint(v, top: bool = True) -> str:
    """`v` as fmt's %v writes it; a value with a String method, by it."""
    string = getattr(v, "string", None)
    if string is not None:
        return string(v)
    if v is None or v is MISSING:  # an action prints Go's nil `any` as <no value>, fmt as <nil>
        return "<no value>" if top else "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return v
    if isinstance(v, Struct):
        raise TemplateError(f"printing a {v.type} value, which has no String method", construct="printing a struct")
    if isinstance(v, list):
        return "[" + " ".join(_sprint(x, False) for x in v) + "]"
    return "map[" + " ".join(f"{k}:{_sprint(v[k], False)}" for k in sorted(v)) + "]"


def _printf(fmt: str, args: list) -> str:
    out, args, pos = [], list(args), 0
    for m in re.finditer(r"%(.|$)", fmt, re.DOTALL):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        verb = m.group(1)
        if not verb:
            out.append("%!(NOVERB)")
            continue
        if verb == "%":
            out.append("%")
            continue
        if verb not in "svd":
            raise TemplateError(f"printf's verb %{verb} is not rendered (only %s, %v, %d and %%)", construct="printf")
        if not args:
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args.pop(0)
        if arg is None or arg is MISSING:
            out.append(f"%!{verb}(<nil>)" if verb != "v" else "<nil>")
            continue
        kind = _kind(arg)
        if (verb, kind) in (
            ("s", "bool"),
            ("s", "int"),
            ("s", "float"),
            ("d", "bool"),
            ("d", "float"),
            ("d", "string"),
        ):
            out.append(f"%!{verb}({_type(arg)}={_sprint(arg, top=False)})")  # fmt's wrong-type form
            continue
        if verb == "d" and kind != "int":
            raise TemplateError(f"printf's %d of {_type(arg)} is not rendered", construct="printf")
        out.append(_sprint(arg, top=False))
    out.append(fmt[pos:])
    if args:
        raise TemplateError(f"printf has {len(args)} more argument(s) than verbs", construct="printf")
    return "".join(out)


def _type(v) -> str:
    if isinstance(v, Struct):
        return v.type
    if v is None or v is MISSING:
        return "nil"
    return {bool: "bool", int: "int", float: "float64", str: "string"}.get(
        type(v), "slice" if isinstance(v, list) else "map"
    )


# --- execution -------------------------------------------------------------------------------


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


_NONE = object()  # no piped value


def _kind(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "other"


def _eq(a, *others) -> bool:
    if not others:
        raise TemplateError("missing argument for comparison")
    for b in others:
        if _kind(a) != _kind(b):
            if a is not MISSING and a is not None and b is not MISSING and b is not None:
                raise TemplateError(f"incompatible types for comparison: {_type(a)} and {_type(b)}")
        elif _kind(a) == "other":
            if (a is None or a is MISSING) != (b is None or b is MISSING):
                continue
            if not (a is None or a is MISSING):
                raise TemplateError(f"non-comparable types: {_type(a)} and {_type(b)}")
            return True
        elif a == b:
            return True
    return False


def _ordered(op: Callable) -> Callable:
    def compare(a, b) -> bool:
        if _kind(a) not in ("int", "float", "string") or _kind(a) != _kind(b):
            raise TemplateError(f"incompatible types for comparison: {_type(a)} and {_type(b)}")
        return op(a, b)

    return compare


def _len(v) -> int:
    if isinstance(v, str):
        return len(v.encode())  # Go counts bytes
    if isinstance(v, list | dict):
        return len(v)
    raise TemplateError(f"len of type {_type(v)}")


def _index(v, *keys):
    if v is None or v is MISSING:
        raise TemplateError("index of untyped nil")
    for key in keys:
        if isinstance(v, dict):
            if not isinstance(key, str):
                raise TemplateError(f"value has type {_type(key)}; should be string")
            v = v.get(key, MISSING)
        elif isinstance(v, list | str):
            items = v.encode() if isinstance(v, str) else v
            if not isinstance(key, int) or isinstance(key, bool):
                raise TemplateError(f"cannot index slice/array with type {_type(key)}")
            if not 0 <= key < len(items):
                raise TemplateError(f"index out of range: {key}")
            v = items[key]
        else:
            raise TemplateError(f"can't index item of type {_type(v)}")
    return v


def _slice(v, *bounds):
    if not isinstance(v, list | str):
        raise TemplateError(f"can't slice item of type {_type(v)}")
    if len(bounds) > 3 or (isinstance(v, str) and len(bounds) > 2):
        raise TemplateError("too many slice indexes")
    items = v.encode() if isinstance(v, str) else v
    idx = [0, len(items), len(items)]
    for j, b in enumerate(bounds):
        if not isinstance(b, int) or isinstance(b, bool):
            raise TemplateError(f"cannot index slice/array with type {_type(b)}")
        idx[j] = b
    lo, hi, cap = idx if len(bounds) == 3 else (idx[0], idx[1], len(items))
    if not 0 <= lo <= hi <= cap <= len(items):
        raise TemplateError(f"index out of range: {bounds}")
    if isinstance(v, str):
        return items[lo:hi].decode(errors="replace")  # Go's bytes; a cut character is U+FFFD here
    return items[lo:hi]


def _sprint_args(args) -> str:
    out = []
    for j, a in enumerate(args):  # a space between operands when neither is a string
        if j and not isinstance(a, str) and not isinstance(args[j - 1], str):
            out.append(" ")
        out.append(_sprint(a, top=False))
    return "".join(out)


_FUNCS = {  # Go's own, but and and or (lazy: the executor's)
    "not": (lambda v: not truth(v), 1),
    "len": (_len, 1),
    "index": (_index, None),
    "slice": (_slice, None),
    "eq": (_eq, None),
    "ne": (lambda a, b: not _eq(a, b), 2),
    "lt": (_ordered(lambda a, b: a < b), 2),
    "le": (_ordered(lambda a, b: a <= b), 2),
    "gt": (_ordered(lambda a, b: a > b), 2),
    "ge": (_ordered(lambda a, b: a >= b), 2),
    "print": (lambda *a: _sprint_args(a), None),
    "println": (lambda *a: " ".join(_sprint(x, top=False) for x in a) + "\n", None),
    "printf": (lambda fmt, *a: _printf(fmt, list(a)), None),
}


Functions = dict[str, tuple[Callable, int | None]]  # name → function, its argument count (None: any)


class Template:
    """A parsed template (`parse`); `execute` renders it on `data`."""

    def __init__(self, nodes: tuple, functions: Functions):
        self.nodes = nodes
        self.functions = functions

    def with_nodes(self, nodes: tuple) -> Template:
        return Template(nodes, self.functions)

    def execute(self, data) -> str:
        out: list[str] = []
        _Exec(data, out, self.functions).walk(data, self.nodes)
        return "".join(out)


def parse(text: str, functions: Functions | None = None) -> Template:
    """`text` parsed as Go parses a template whose FuncMap is `functions` (each called with
    the values of its arguments), or TemplateError."""
    functions = {**(functions or {}), **_FUNCS, "and": (None, None), "or": (None, None)}
    return Template(_Parser(text, functions).parse(), functions)


class _Exec:
    def __init__(self, data, out: list[str], functions: Functions):
        self.vars: list[list] = [["$", data]]
        self.out = out
        self.line = 0
        self.functions = functions
        self.steps = self.size = 0

    def emit(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise self.error(TemplateError(f"the output passes {MAX_OUTPUT} characters (greenroom's limit)"))
        self.out.append(text)

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.error(TemplateError(f"execution passes {MAX_STEPS} steps (greenroom's limit)"))

    def walk(self, dot, nodes) -> None:
        for node in nodes:
            self.step()
            if isinstance(node, Text):
                self.emit(node.text)
            elif isinstance(node, Action):
                value = self.pipe(dot, node.pipe)
                if not node.pipe.decl:
                    self.emit(self.printed(value))
            elif isinstance(node, Branch):
                self.branch(dot, node)
            elif isinstance(node, Break):
                raise _Break
            else:
                raise _Continue

    def printed(self, value) -> str:
        try:
            return _sprint(value)
        except TemplateError as exc:
            raise self.error(exc) from None

    def error(self, exc: TemplateError) -> TemplateError:
        if str(exc).startswith("line "):
            return exc
        return TemplateError(f"line {self.line}: executing: {exc}", exc.construct)

    def branch(self, dot, node: Branch) -> None:
        mark = len(self.vars)
        try:
            value = self.pipe(dot, node.pipe)  # a range's variables hold it too, in its else part
            if node.kind == "range":
                self.range(dot, node, value, len(self.vars))
            elif truth(value):
                self.walk(value if node.kind == "with" else dot, node.body)
            elif node.orelse is not None:
                self.walk(dot, node.orelse)
        finally:
            del self.vars[mark:]

    def range(self, dot, node: Branch, value, mark: int) -> None:
        if value is None or value is MISSING:
            pairs = []
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        elif isinstance(value, dict):
            pairs = [(k, value[k]) for k in sorted(value)]
        else:
            raise self.error(TemplateError(f"range can't iterate over {self.printed(value)}"))
        if not pairs:
            if node.orelse is not None:
                self.walk(dot, node.orelse)
            return
        for key, elem in pairs:
            self.step()
            names = node.pipe.decl
            if len(names) == 1:
                self.vars.append([names[0], elem])
            elif len(names) == 2:
                self.vars += [[names[0], key], [names[1], elem]]
            try:
                self.walk(elem, node.body)
            except _Break:
                break
            except _Continue:
                pass
            finally:
                del self.vars[mark:]

    def pipe(self, dot, pipe: Pipe):
        self.line = pipe.line
        value = _NONE
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value)
        for name in pipe.decl:
            if pipe.assign:
                next(v for v in reversed(self.vars) if v[0] == name)[1] = value
            else:
                self.vars.append([name, value])
        return value

    def command(self, dot, cmd: Command, final):
        first, rest = cmd.args[0], cmd.args[1:]
        if isinstance(first, Identifier):
            return self.call(dot, first.name, rest, final)
        if isinstance(first, Literal) and first.source == "nil":
            raise self.error(TemplateError("nil is not a command"))
        if rest or final is not _NONE:
            raise self.error(TemplateError(f"can't give argument to non-function {_describe(first)}"))
        return self.arg(dot, first)

    def arg(self, dot, node):
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self.fields(dot, node.idents)
        if isinstance(node, Variable):
            return self.chained(next(v[1] for v in reversed(self.vars) if v[0] == node.name), node.idents)
        if isinstance(node, Chain):
            return self.chained(self.arg(dot, node.node), node.idents)
        if isinstance(node, Pipe):
            return self.pipe(dot, node)
        return self.call(dot, node.name, (), _NONE)  # a function named as an argument: called bare

    def chained(self, value, idents):
        """Fields of a variable's or a pipeline's value: Go holds a nil there as no value at
        all, whose fields are no value too (a nil met along a chain of fields is an error)."""
        return MISSING if idents and (value is None or value is MISSING) else self.fields(value, idents)

    def fields(self, value, idents):
        for name in idents:
            if isinstance(value, Struct):
                if name in value.fields:
                    value = value.fields[name]
                elif name in value.methods:
                    value = value.methods[name](value)
                elif name == "String" and value.string is not None:
                    value = value.string(value)
                else:
                    raise self.error(TemplateError(f"can't evaluate field {name} in type {value.type}"))
            elif isinstance(value, dict):
                value = value.get(name, MISSING)
            elif value is None or value is MISSING:
                raise self.error(TemplateError(f"nil pointer evaluating interface {{}}.{name}"))
            else:
                raise self.error(TemplateError(f"can't evaluate field {name} in type {_type(value)}"))
        return value

    def call(self, dot, name: str, args: tuple, final):
        if name in ("and", "or"):
            thunks = [lambda a=a: self.arg(dot, a) for a in args]
            if final is not _NONE:
                thunks.append(lambda: final)
            if not thunks:
                raise self.error(TemplateError(f"wrong number of args for {name}: want at least 1 got 0"))
            for thunk in thunks:
                value = thunk()
                if truth(value) == (name == "or"):
                    return value
            return value
        fn, count = self.functions[name]
        values = [self.arg(dot, a) for a in args] + ([] if final is _NONE else [final])
        if count is not None and len(values) != count:
            raise self.error(TemplateError(f"wrong number of args for {name}: want {count} got {len(values)}"))
        if name in ("index", "slice", "printf", "eq") and not values:
            raise self.error(TemplateError(f"wrong number of args for {name}: want at least 1 got 0"))
        if name == "printf" and not isinstance(values[0], str):
            raise self.error(TemplateError(f"printf's format is a {_type(values[0])}, not a string"))
        try:
            return fn(*values)
        except TemplateError as exc:
            raise self.error(TemplateError(f"error calling {name}: {exc}", exc.construct)) from None


def _describe(node) -> str:
    if isinstance(node, Literal):
        return node.source
    if isinstance(node, Field):
        return "." + ".".join(node.idents)
    if isinstance(node, Variable):
        return node.name + "".join("." + i for i in node.idents)
    return "(pipeline)" if isinstance(node, Pipe | Chain) else "."
