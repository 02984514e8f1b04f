"""Ollama's `template` override on /api/generate, in the subset greenroom renders."""

from __future__ import annotations

import re

from greenroom.errors import GreenroomError

_VAR = re.compile(r"\{\{(-?)\s*\.(System|Prompt|Response)\s*(-?)\}\}")
_RESPONSE = re.compile(r"\{\{-?\s*\.Response\s*-?\}\}")


def apply_template(template: str, system: str | None, prompt: str) -> str:
    """`{{ .System }}`, `{{ .Prompt }}` and `{{ .Response }}` (where the answer begins; the
    rest is dropped), with Go's `{{-` / `-}}` whitespace trimming. Anything else is refused."""
    head = template
    m = _RESPONSE.search(template)
    if m:
        head = template[: m.end()]
    pieces, pos = [], 0
    for m in _VAR.finditer(head):
        before = head[pos : m.start()]
        pieces.append(before.rstrip() if m.group(1) else before)
        pieces.append({"System": system or "", "Prompt": prompt, "Response": ""}[m.group(2)])
        pos = m.end()
        if m.group(3):
            rest = head[pos:]
            pos += len(rest) - len(rest.lstrip())
    pieces.append(head[pos:])
    if "{{" in _VAR.sub("", head):
        raise GreenroomError(
            "field_not_honoured",
            "'template' cannot be honoured: greenroom renders only "
            "{{ .System }}, {{ .Prompt }} and {{ .Response }} in a template override; send "
            "raw: true with a prompt you rendered yourself",
            "template",
        )
    return "".join(pieces)
