"""Ollama's `options` → greenroom's SamplingParams and the request's context window.

ONE table, `OPTIONS`, says for every option Ollama defines (api/types.go's Options and
Runner) its default, its type and what greenroom does with it. Every request's options
are the defaults with the sent values merged over them; then

- SAMPLING: renamed onto a SamplingParams field (repeat_penalty → repetition_penalty,
  stop → stop, …);
- PENALTY: presence_penalty and frequency_penalty → one repetition penalty with
  openai_params.repetition_penalty, 1 + (presence + frequency) / 2 — only when sent and
  repeat_penalty was not (an explicit repeat_penalty wins);
- LENGTH: num_predict → max_tokens; -1 (infinite) and -2 (fill the context) both mean
  "until the request's window is full";
- WINDOW: num_ctx → the request's context window, clamped as Ollama's scheduler and runner
  clamp it (at least 4, at most the model's trained window: never a 400; `window`); a prompt
  longer than it is cut by Ollama's rule (engines/prompt_fit.py), and num_keep → the
  tokens such a cut keeps at the prompt's start;
- DROPPED: logged at debug and not applied (mirostat*, min_p, typical_p, tfs_z, the
  load-time knobs); reported when sent with a value other than the no-change one.

Unknown options are logged as a warning and reported.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import attrs

from greenroom.engines.base import SEED_MAX, SamplingParams
from greenroom.engines.capabilities import WHY_NOT, Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.core.contracts import INT64, AnyOf, Boolean, Field, ListOf, Number, Shape, Text
from greenroom.http.core.headers import NUM_CTX_HEADER
from greenroom.http.ollama import keep_alive
from greenroom.http.openai.openai_params import repetition_penalty

log = logging.getLogger("greenroom.http.ollama")

# what greenroom does with an option
SAMPLING, PENALTY, LENGTH, WINDOW, KEEP, DROPPED = ("sampling", "penalty", "length", "window", "keep", "dropped")
# value types, as Ollama's Options.FromMap accepts them
FLOAT, INT, BOOL, STRINGS = "float", "int", "bool", "strings"

MAX_INT = 2**31 - 1
GO_INT = (-(2**63), 2**63 - 1)  # what Ollama's Go int fields take (past them: its 400)


@attrs.frozen
class Option:
    default: Any  # merged when the option is not sent (None: nothing is merged)
    type: str
    handling: str
    target: str | None = None  # the SamplingParams field (SAMPLING)
    lo: float | None = None  # inclusive bounds, when greenroom needs any
    hi: float | None = None
    above: float | None = None  # exclusive lower bound
    needs: str | None = None  # the engine capability that honours a sent value


def _dropped(default: Any, type_: str) -> Option:
    return Option(default, type_, DROPPED)


OPTIONS: dict[str, Option] = {
    # the spec's table of merged defaults, in its order
    "temperature": Option(0.8, FLOAT, SAMPLING, "temperature", lo=0.0),
    "top_k": Option(40, INT, SAMPLING, "top_k", lo=0, hi=INT64[1]),  # msgpack's 64 bits carry it to the engine
    "top_p": Option(0.9, FLOAT, SAMPLING, "top_p", lo=0.0, hi=1.0),
    "repeat_penalty": Option(1.1, FLOAT, SAMPLING, "repetition_penalty", above=0.0, needs="penalties"),
    "num_predict": Option(128, INT, LENGTH, lo=-2, hi=MAX_INT),
    "num_ctx": Option(2048, INT, WINDOW, lo=GO_INT[0], hi=GO_INT[1]),  # clamped (`window`)
    "num_batch": _dropped(512, INT),
    # Ollama's default, -1 (any negative): random — a seed drawn per request and echoed where the engine
    # reproduces it (X-Greenroom-Drawn-Seed), not the spec's 0, which made every Regenerate repeat itself
    "seed": Option(-1, INT, SAMPLING, "seed", hi=SEED_MAX, needs="seed"),
    "stop": Option((), STRINGS, SAMPLING, "stop"),
    "mirostat": _dropped(0, INT),
    "mirostat_tau": _dropped(5.0, FLOAT),
    "mirostat_eta": _dropped(0.1, FLOAT),
    "min_p": _dropped(0.0, FLOAT),
    "typical_p": _dropped(1.0, FLOAT),
    "tfs_z": _dropped(1.0, FLOAT),
    # approximate: mapped to one repetition penalty (see PENALTY)
    "presence_penalty": Option(0.0, FLOAT, PENALTY, needs="penalties"),
    "frequency_penalty": Option(0.0, FLOAT, PENALTY, needs="penalties"),
    # Ollama's other options: accepted, no effect on greenroom's output
    "num_keep": Option(4, INT, KEEP, lo=0, hi=MAX_INT),  # Ollama's default (api/types.go)
    "repeat_last_n": _dropped(None, INT),  # greenroom penalises every token seen
    "penalize_newline": _dropped(None, BOOL),
    "numa": _dropped(None, BOOL),
    "num_gpu": _dropped(None, INT),
    "main_gpu": _dropped(None, INT),
    "low_vram": _dropped(None, BOOL),
    "f16_kv": _dropped(None, BOOL),
    "logits_all": _dropped(None, BOOL),
    "vocab_only": _dropped(None, BOOL),
    "use_mmap": _dropped(None, BOOL),
    "use_mlock": _dropped(None, BOOL),
    "num_thread": _dropped(None, INT),
    "embedding_only": _dropped(None, BOOL),
}
_DEFAULTS = {name: opt.default for name, opt in OPTIONS.items()}  # each request's options start from these


def _field(opt: Option) -> Field:
    """An option as the request contract documents it (what `_value` accepts)."""
    what = {
        SAMPLING: f"→ {opt.target}",
        PENALTY: "→ one repetition penalty with the other",
        LENGTH: "→ max_tokens; -1 and -2: until the window is full",
        WINDOW: "the request's context window: clamped to [4, the model's window], "
        f"the value used said in {NUM_CTX_HEADER}",
        KEEP: "the tokens a cut prompt keeps at its start",
        DROPPED: "accepted, not applied (reported when not the no-change value)",
    }[opt.handling]
    notes = {"description": what, "default": opt.default if opt.default not in (None, ()) else None}
    if opt.type == BOOL:
        return Boolean(**notes)
    if opt.type == STRINGS:
        return AnyOf(options=(Text(), ListOf(items=Text())), **notes)
    return Number(lo=opt.lo, hi=opt.hi, above=opt.above, integer=opt.type == INT, **notes)


# Ollama's options: unknown ones are reported; on /api/create's parameters they are refused
SHAPE = Shape(
    fields={name: _field(opt) for name, opt in OPTIONS.items()},
    description=("Ollama's options, merged over its defaults; an integer option takes an integral float too"),
)
KEEP_ALIVE = AnyOf(
    options=(
        Number(hi=keep_alive.MAX_SECONDS),
        Text(pattern=rf"\s*(?:{keep_alive._DURATION.pattern})\s*"),
    ),  # keep_alive.parse
    description="How long the model stays loaded after the request: seconds, or a Go duration such "
    f'as "5m"; negative: for good; 0: unloaded after it; at most {keep_alive.MAX_SECONDS:.0f} s',
)


@attrs.frozen
class Resolved:
    """A request's options, merged and mapped."""

    params: SamplingParams  # max_tokens: num_predict, or None when the answer fills the window
    fill: bool  # num_predict -1 / -2: until the window is full
    num_ctx: int | None  # sent explicitly; None: the default window
    num_keep: int  # the tokens a cut prompt keeps at its start
    unread: list[str]  # "options.<name>" locations not honoured (X-miLLM-Ignored-Fields)


def _where(name: str) -> str:
    return f"options.{name}"


def _value(name: str, value: Any, opt: Option) -> Any:
    """Check a sent value's type and bounds; ints may be sent as integral floats (Ollama
    truncates JSON numbers into int options; a fraction is refused here instead)."""
    where = _where(name)
    if opt.type == BOOL:
        if not isinstance(value, bool):
            raise GreenroomError("invalid_parameter", f"'{where}' must be a boolean", where)
        return value
    if opt.type == STRINGS:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(value)
        raise GreenroomError("invalid_parameter", f"'{where}' must be an array of strings", where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GreenroomError("invalid_parameter", f"'{where}' must be a finite number", where)
    if opt.type == INT:
        if value != int(value):
            raise GreenroomError("invalid_parameter", f"'{where}' must be an integer, got {value}", where)
        value = int(value)
    else:
        value = float(value)
    if (
        (opt.lo is not None and value < opt.lo)
        or (opt.hi is not None and value > opt.hi)
        or (opt.above is not None and value <= opt.above)
    ):
        bounds = " and ".join(
            b
            for b in (
                f"≥ {opt.lo:g}" if opt.lo is not None else "",
                f"> {opt.above:g}" if opt.above is not None else "",
                f"≤ {opt.hi:g}" if opt.hi is not None else "",
            )
            if b
        )
        raise GreenroomError("invalid_parameter", f"'{where}' must be {bounds}, got {value}", where)
    return value


def _no_change(name: str, value: Any, opt: Option) -> bool:
    """Whether a sent value asks for nothing the default does not (any negative seed: random)."""
    return value == opt.default or (name == "seed" and value < 0)


def resolve(options: Any, caps: Capabilities) -> Resolved:
    """Merge the defaults with the sent options, validate, map. Raises a typed 400 naming
    the option; never reads past the table."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise GreenroomError("invalid_parameter", "'options' must be an object", "options")
    sent: dict[str, Any] = {}
    unread: list[str] = []
    for name, value in options.items():
        opt = OPTIONS.get(name)
        if opt is None:
            log.warning("unknown Ollama option %r ignored", name)
            unread.append(_where(name))
            continue
        if value is None:  # Ollama skips nulls
            continue
        sent[name] = _value(name, value, opt)
        if opt.needs and not getattr(caps, opt.needs) and not _no_change(name, sent[name], opt):
            raise GreenroomError(
                "field_not_honoured",
                f"'{_where(name)}' cannot be honoured by this model's engine: {WHY_NOT[opt.needs]}",
                _where(name),
            )
    merged = _DEFAULTS | sent
    for name, value in sent.items():
        opt = OPTIONS[name]
        if opt.handling == DROPPED:
            log.debug("options.%s=%s accepted and dropped: greenroom does not apply it", name, value)
            if value != (False if opt.default is None and opt.type == BOOL else opt.default):
                unread.append(_where(name))

    if "repeat_penalty" in sent or not ({"presence_penalty", "frequency_penalty"} & sent.keys()):
        penalty = merged["repeat_penalty"]
    else:
        penalty = repetition_penalty(merged["presence_penalty"], merged["frequency_penalty"])
    seed = merged["seed"]
    num_predict = merged["num_predict"]
    params = SamplingParams(
        max_tokens=None if num_predict < 0 else num_predict,
        temperature=merged["temperature"],
        top_p=merged["top_p"],
        top_k=merged["top_k"],
        stop=tuple(merged["stop"]),
        seed=None if seed < 0 else seed,
        repetition_penalty=penalty,
    )
    return Resolved(params, num_predict < 0, sent.get("num_ctx"), merged["num_keep"], unread)


MIN_CTX = 4  # Ollama's scheduler raises a smaller num_ctx to this


def window(resolved: Resolved, context_length: int) -> int:
    """The request's context window as Ollama sets it: num_ctx (sent, else the default)
    capped at the model's trained window (its runner's "requested context size too large for
    model") and raised to MIN_CTX (its scheduler's floor) — 0 or a window past the model's is
    clamped, never refused; the response says the value in X-Greenroom-Num-Ctx."""
    asked = OPTIONS["num_ctx"].default if resolved.num_ctx is None else resolved.num_ctx
    if asked > context_length:
        log.info("options.num_ctx %d is past the model's window: %d is used", asked, context_length)
    return max(MIN_CTX, min(asked, context_length))


def shown(context_length: int, own: dict) -> list[tuple[str, object]]:
    """The options this surface applies to a model, as /api/show reports them: its defaults,
    over them a created model's own parameters (`own`); (name, value) pairs, a list's (stop)
    one pair per element."""
    merged = {
        name: min(opt.default, context_length) if opt.handling == WINDOW else opt.default
        for name, opt in OPTIONS.items()
        if opt.handling in (SAMPLING, LENGTH, WINDOW) and opt.default not in (None, ())
    }
    merged.update(own)
    return [(name, v) for name, value in merged.items() for v in (value if isinstance(value, list) else [value])]
