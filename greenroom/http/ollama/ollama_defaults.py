"""A model made by /api/create carries defaults — `system`, `template`, `parameters`,
`messages` — which /api/generate and /api/chat merge into each request for it, as Ollama
applies a Modelfile's: a request's own value wins (its options key by key).

- generate: `system` and `template` when the request sends none; `parameters` under the
  request's `options`.
- chat: `system` as a first system message when the conversation has none, then the
  created `messages` before the request's; `parameters` likewise. A `template` renders the
  chat (the chat route reads it: ollama_templates.py), else the model's own chat template.
"""

from __future__ import annotations

from greenroom.supervisor.placements import Placement


def apply(body: dict, placement: Placement, chat: bool) -> dict:
    """`body` with the defaults of the placement's model merged in (the same body when it
    has none). Values are validated afterwards, as the request's own are."""
    defaults = placement.defaults
    if not defaults:
        return body
    out = dict(body)
    if defaults.get("parameters"):
        options = body.get("options")
        out["options"] = (
            {**defaults["parameters"], **options}
            if isinstance(options, dict)
            else (defaults["parameters"] if options is None else options)
        )
    if chat:
        messages = body.get("messages")
        if isinstance(messages, list) and messages:  # no messages: a load request, nothing to prepend
            system = defaults.get("system")
            has_system = any(isinstance(m, dict) and m.get("role") == "system" for m in messages)
            head = [{"role": "system", "content": system}] if system and not has_system else []
            out["messages"] = head + list(defaults.get("messages") or []) + messages
    else:
        for field in ("system", "template"):
            if defaults.get(field) and body.get(field) in (None, ""):
                out[field] = defaults[field]
    return out
