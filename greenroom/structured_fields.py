"""RFC 8941 structured field values: the one serialiser of greenroom's X-miLLM-* and
X-Greenroom-* response headers (the spec words X-miLLM-Ignored-Fields and
X-miLLM-Circuit-Rung as RFC 8941; the others follow suit). Only what those headers hold:
strings, integers, decimals, items with parameters, lists and dictionaries of items.
The tests parse every header with http-sf, an independent implementation.

Standard library only: the front end and the actors both serialise.
"""

from __future__ import annotations

import math

_INTEGER_MAX = 999_999_999_999_999  # sf-integer: at most 15 digits


def string(text: str) -> str:
    """An sf-string. It holds printable ASCII only, so '%' and every other character are
    percent-encoded as UTF-8 (the spec's rule for field names), '"' and '\\' escaped."""
    out = []
    for ch in text:
        if ch == "%" or not 0x20 <= ord(ch) <= 0x7E:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        elif ch in '"\\':
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def bare(value) -> str:
    """An sf-integer, sf-decimal (at most 3 fraction digits, rounded) or sf-string."""
    if isinstance(value, bool):
        return "?1" if value else "?0"
    if isinstance(value, int):
        if abs(value) > _INTEGER_MAX:
            raise ValueError(f"{value} is past an sf-integer's 15 digits")
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= 1e12:
            raise ValueError(f"{value} is not an sf-decimal")
        text = f"{round(value, 3):.3f}".rstrip("0")
        return text + "0" if text.endswith(".") else text
    if isinstance(value, str):
        return string(value)
    raise TypeError(f"no structured field for {type(value).__name__}")


def item(value, params: dict, spaced: bool = False) -> str:
    """A bare item with its parameters (`;key=value`; a parameter true is written bare).
    `spaced`: a space after each ';', as the spec writes X-miLLM-Circuit-Rung (parsers
    skip it; X-miLLM-Seed it writes without)."""
    sep = "; " if spaced else ";"
    return bare(value) + "".join(f"{sep}{k}" if v is True else f"{sep}{k}={bare(v)}" for k, v in params.items())


def list_of(values) -> str:
    """An sf-list of bare items."""
    return ", ".join(bare(v) for v in values)


def dictionary(members: dict) -> str:
    """An sf-dictionary of bare items (keys: lowercase tokens)."""
    return ", ".join(f"{k}={bare(v)}" for k, v in members.items())
