"""The docs' tables that restate declarations, generated from them: `make docs` (or
`python -m greenroom.http.docs_tables`) rewrites each between its markers, and
tests/unit/test_docs_tables.py fails, naming the command, while a page differs from what this
writes.

- docs/openai.md's "How greenroom treats each parameter": a row per field of chat and text
  completions (a few grouped under one that describes them all), each cell the field's
  description and ledger rule as /openapi.json renders them (`contracts.Shape.described`).
- docs/engines.md's capability table: greenroom/engines/capabilities.py's ENGINES.
"""

from __future__ import annotations

import pathlib
import sys

from greenroom.engines.capabilities import ENGINES
from greenroom.http.core import contracts
from greenroom.http.openai import openai_api

DOCS = pathlib.Path(__file__).parents[2] / "docs"
COMMAND = "make docs"

# the parameter table's rows, in order: a row's first field is described; the others share its row.
# A field declared on chat or text completions and not listed here gets a row of its own, last.
PARAMETERS = (
    ("model",),
    ("messages",),
    ("prompt",),
    ("stream",),
    ("temperature",),
    ("top_p",),
    ("top_k",),
    ("n",),
    ("max_tokens", "max_completion_tokens"),
    ("stop",),
    ("seed",),
    ("frequency_penalty", "presence_penalty"),
    ("stream_options.include_usage",),
    ("chat_template_kwargs",),
    ("add_special_tokens",),
    ("user",),
    ("logprobs", "top_logprobs", "return_tokens_as_token_ids"),
    ("allowed_token_ids",),
    ("echo",),
    ("response_format",),
    ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"),
    ("extra_messages",),
    ("profile", "steering_intensity"),
    ("return_sae_activations",),
    ("steering",),
    ("logit_bias",),
    ("dimensions",),
    ("best_of",),
    ("suffix",),
)

# the capability table's rows, in order: label → the capability field
CAPABILITIES = (
    ("`seed` (byte-identical)", "seed"),
    ("`n` > 1", "n"),
    ("penalties", "penalties"),
    ("embeddings", "embeddings"),
    ("`chat_template_kwargs`", "chat_template_kwargs"),
    ("scoring (`logprobs`, `allowed_token_ids`, `echo`)", "scoring"),
    ("`response_format`, required/named `tool_choice`", "response_format"),
    ("`tools`", "tools"),
    ("`steering_intensity`", "steering"),
    ("`profile`", "profile"),
    ("`return_sae_activations`", "sae_activations"),
    ("token log-probabilities (`logprobs` of generated tokens, Needle's confidence)", "token_logprobs"),
)


def _cell(shape: contracts.Shape, path: str) -> str:
    """What `shape` declares for the field at `path` ("a.b": b inside a's object), or "—"."""
    *outer, name = path.split(".")
    for part in outer:
        shape = contracts.shape(shape.fields.get(part)) if shape else None
    if shape is None or name not in shape.fields:
        return "—"
    return shape.described(name).replace("|", "\\|").replace("\n", " ") or "read"


def rows() -> tuple[tuple[str, ...], ...]:
    """PARAMETERS, then a row for each declared field they do not list."""
    listed = {name.split(".")[0] for names in PARAMETERS for name in names}
    declared = [*openai_api.CHAT.fields, *openai_api.COMPLETION.fields]
    return PARAMETERS + tuple((name,) for name in dict.fromkeys(declared) if name not in listed)


def parameters() -> str:
    out = ["| Parameter | Chat completions | Text completions |", "| --- | --- | --- |"]
    for names in rows():
        chat, text = _cell(openai_api.CHAT, names[0]), _cell(openai_api.COMPLETION, names[0])
        if text == chat:
            text = "as on chat completions"
        out.append(f"| {', '.join(f'`{n}`' for n in names)} | {chat} | {text} |")
    return "\n".join(out)


# the last row: the SAE hook points each engine reads and steers (capabilities.hook_sites)
HOOK_POINTS = "SAE hook points read and steered (`blocks.L.…`)"


def hook_points(sites: tuple[str, ...]) -> str:
    return ", ".join(f"`hook_{site}`" for site in sites) or "—"


def capabilities() -> str:
    rows = ["| capability | " + " | ".join(ENGINES) + " |", "| --- |" + " --- |" * len(ENGINES)]
    for label, field in CAPABILITIES:
        rows.append(f"| {label} | " + " | ".join("yes" if getattr(c, field) else "no" for c in ENGINES.values()) + " |")
    rows.append(f"| {HOOK_POINTS} | " + " | ".join(hook_points(c.hook_sites) for c in ENGINES.values()) + " |")
    return "\n".join(rows)


# page → (the table's name in its markers, the function writing it)
TABLES = {"openai.md": ("parameters", parameters), "engines.md": ("capabilities", capabilities)}


def markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- {name} table: generated from the declarations by `{COMMAND}`; edit them, not this -->",
        f"<!-- end of {name} table -->",
    )


def generated(page: str) -> str:
    """docs/<page> with its table as the declarations write it."""
    name, write = TABLES[page]
    text = (DOCS / page).read_text(encoding="utf-8")
    begin, end = markers(name)
    head, _, rest = text.partition(begin + "\n")
    _, _, tail = rest.partition("\n" + end)
    assert rest and tail, f"docs/{page} lacks the markers of its {name} table"
    return f"{head}{begin}\n{write()}\n{end}{tail}"


def main() -> int:
    for page in TABLES:
        path = DOCS / page
        text = generated(page)
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/{page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
