"""Request contracts (greenroom/http/core/contracts.py): a field's ledger rule is part of its
declaration, so the field ledger's checks and the OpenAPI document read one object.

The derivation was proven identical to the hand-kept tables it replaced (ledger.py's CHAT…
DETOKENIZE, the Ollama modules' GENERATE…CREATE): in the commit that moved the rules, this
file compared the table read off each of the 17 Shapes with the old table, equal field by
field. What stays here pins each kind of rule on each surface, read through the Shapes."""

from __future__ import annotations

import pathlib
import re

import attrs
import pytest

from greenroom.engines.capabilities import ENGINES, WHY_NOT, Capabilities
from greenroom.errors import GreenroomError
from greenroom.http.anthropic import messages_api
from greenroom.http.core import contracts, ledger, openapi
from greenroom.http.ollama import ollama_api, ollama_embed, ollama_models
from greenroom.http.openai import openai_api, openai_params, responses_api, tokenize_api

NONE = Capabilities()
ALL = ENGINES["transformers"]
WHERE = "on test"

# (request, field, value, capabilities) → None (read), "reported", or the refusal's reason
CASES = [
    (openai_api.CHAT, "temperature", 0.5, NONE, None),
    (openai_api.CHAT, "seed", 1, NONE, WHY_NOT["seed"]),
    (openai_api.CHAT, "seed", 1, ALL, None),
    (openai_api.CHAT, "frequency_penalty", 0.0, NONE, None),  # its no-op value
    (openai_api.CHAT, "n", 1, NONE, None),
    (openai_api.CHAT, "n", 2, NONE, WHY_NOT["n"]),
    (openai_api.CHAT, "user", "u", ALL, "reported"),
    (openai_api.CHAT, "logit_bias", {}, ALL, None),
    (openai_api.CHAT, "logit_bias", {"1": 2}, ALL, "not yet implemented"),
    (openai_api.CHAT, "echo", True, ALL, "echo is served on text completions"),
    (openai_api.CHAT, "chat_template_kwargs", {"a": 1}, NONE, "reported"),
    (openai_api.CHAT, "chat_template_kwargs", {"a": 1}, ALL, None),
    (openai_api.CHAT, "profile", "p", NONE, WHY_NOT["profile"]),
    (openai_api.CHAT, "no_such_field", 1, ALL, "reported"),
    (openai_api.COMPLETION, "n", 2, ALL, "send a list of prompts"),
    (openai_api.COMPLETION, "echo", True, NONE, WHY_NOT["scoring"]),
    (openai_api.COMPLETION, "echo", True, ALL, None),
    (openai_api.COMPLETION, "best_of", 1, ALL, None),
    (openai_api.COMPLETION, "tools", [{"type": "function"}], ALL, "tools are served on chat completions"),
    (openai_params.EMBEDDING, "seed", 1, ALL, "embeddings have no such setting"),
    (openai_params.EMBEDDING, "logprobs", False, ALL, None),
    (openai_params.EMBEDDING, "user", "u", ALL, "reported"),
    (responses_api.REQUEST, "truncation", "disabled", ALL, None),
    (responses_api.REQUEST, "truncation", "auto", ALL, "never cut"),
    (responses_api.REQUEST, "text", {"format": {"type": "text"}}, NONE, None),
    (responses_api.REQUEST, "text", {"format": {"type": "json_object"}}, NONE, WHY_NOT["response_format"]),
    (responses_api.REQUEST, "service_tier", "auto", ALL, "reported"),
    (messages_api.REQUEST, "thinking", {"type": "disabled"}, ALL, None),
    (messages_api.REQUEST, "thinking", {"type": "enabled"}, ALL, "does not think"),
    (messages_api.REQUEST, "metadata", {"user_id": "u"}, ALL, "reported"),
    (messages_api.COUNT_REQUEST, "output_config", {}, NONE, None),
    (messages_api.COUNT_REQUEST, "mcp_servers", [{}], ALL, "no tools of its own"),
    (tokenize_api.TOKENIZE, "chat_template", "x", ALL, "the model's own chat template"),
    (tokenize_api.DETOKENIZE, "tokens", [1], NONE, None),
    (ollama_api.GENERATE_REQUEST, "images", [], ALL, None),
    (ollama_api.GENERATE_REQUEST, "images", ["x"], ALL, ledger.TEXT_ONLY),
    (ollama_api.GENERATE_REQUEST, "format", "", NONE, None),
    (ollama_api.GENERATE_REQUEST, "format", "json", NONE, WHY_NOT["response_format"]),
    (ollama_api.CHAT_REQUEST, "top_logprobs", 0, NONE, None),
    (ollama_api.CHAT_REQUEST, "top_logprobs", 2, NONE, WHY_NOT["token_logprobs"]),
    (ollama_api.SHOW_REQUEST, "system", "", NONE, None),
    (ollama_api.SHOW_REQUEST, "system", "Be brief.", NONE, "reported"),
    (ollama_embed.EMBED_REQUEST, "options", {}, NONE, "reported"),
    (ollama_embed.EMBEDDINGS_REQUEST, "options", {}, NONE, "reported"),
    (ollama_models.PULL_REQUEST, "insecure", False, NONE, None),
    (ollama_models.PULL_REQUEST, "insecure", True, NONE, "HF_ENDPOINT"),
    (ollama_models.CREATE_REQUEST, "quantize", "q4_K_M", NONE, "does not quantize"),
    (ollama_models.DELETE_REQUEST, "name", "m", NONE, None),
    (ollama_models.COPY_REQUEST, "source", "m", NONE, None),
]


@pytest.mark.parametrize("shape,field,value,caps,outcome", CASES)
def test_the_ledger_reads_each_rule_off_the_declaration(shape, field, value, caps, outcome):
    if outcome in (None, "reported"):
        assert ledger.check(shape, {field: value}, caps, WHERE, translated=True) == [field] * (outcome == "reported")
        return
    with pytest.raises(GreenroomError) as e:
        ledger.check(shape, {field: value}, caps, WHERE, translated=True)
    assert (e.value.code, e.value.param) == ("field_not_honoured", field)
    assert outcome in e.value.message


def test_every_request_the_ledger_checks_is_marked_so():
    checked = {name for name, shape in openapi._REQUESTS.items() if shape.ledger}
    assert len(checked) == 17 and {"ChatCompletionRequest", "OllamaCreateRequest", "DetokenizeRequest"} <= checked


def test_a_rule_renders_as_what_it_lets_through():
    components: dict = {}
    chat = openai_api.CHAT.render(components)
    assert chat["description"].endswith(contracts.UNKNOWN)
    assert chat["properties"]["logit_bias"] == {
        "enum": [None, {}],
        "description": "Refused with 400 field_not_honoured unless null or {}: not yet implemented",
    }
    assert chat["properties"]["user"] == {"description": "Not read: reported in X-miLLM-Ignored-Fields"}
    assert chat["properties"]["seed"]["description"] == (
        f"{openai_params.SEED.description}. "
        f"Refused with 400 field_not_honoured unless null by an engine without seed ({WHY_NOT['seed']})"
    )
    # the same field outside a request the ledger checks carries no ledger words
    assert openai_params.SEED.render({})["description"] == openai_params.SEED.description


def test_a_field_is_added_in_one_place():
    """The acceptance of issue 30 in miniature: one declaration, with its rule, and the ledger and
    the document both have it."""
    field = contracts.Number(lo=0, hi=1, description="How much", rule=contracts.needs("penalties", 0))
    chat = attrs.evolve(openai_api.CHAT, fields={**openai_api.CHAT.fields, "how_much": field})
    assert ledger.check(chat, {"how_much": 0}, NONE, WHERE, translated=True) == []
    with pytest.raises(GreenroomError) as e:
        ledger.check(chat, {"how_much": 0.5}, NONE, WHERE, translated=True)
    assert e.value.param == "how_much"
    rendered = chat.render({})["properties"]["how_much"]
    assert rendered["type"] == ["number", "null"] and rendered["description"].startswith("How much. Refused")


def _documented(page: str, heading: str) -> set[str]:
    """The fields named in the first column of the table under `heading` in docs/<page>."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / page).read_text()
    section = text[text.index(heading) :]
    rows = section[section.index("\n| ") :].split("\n\n")[0].splitlines()[3:]  # past the header and rule
    rows = [row for row in rows if row.startswith("| ")]  # not the generated table's end marker
    return {name.split(".")[0] for row in rows for name in re.findall(r"`([a-z_.]+)`", row.split("|")[1])}


def test_the_docs_table_is_the_declaration():
    """docs/openai.md's parameter table names every chat and text completion field the Shapes
    declare, and no other: a field added to a declaration fails here until the table says what it does."""
    declared = set(openai_api.CHAT.fields) | set(openai_api.COMPLETION.fields)
    assert _documented("openai.md", "## How greenroom treats each parameter") == declared


def test_anthropic_messages_report_what_their_declarations_report():
    """messages_api reads a message's keys, its blocks' types and their reported keys
    (cache_control, is_error) off MESSAGE's declaration."""
    out: list[dict] = []
    unread: list[str] = []
    messages_api._message(
        {"role": "assistant", "content": [{"type": "text", "text": "Hi", "cache_control": {}, "x": 1}], "id": "m"},
        0,
        out,
        unread,
    )
    messages_api._message(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "4", "is_error": False}],
        },
        1,
        [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}]}],
        unread,
    )
    assert unread == [
        "messages[0].id",
        "messages[0].content[0].cache_control",
        "messages[0].content[0].x",
        "messages[1].content[0].is_error",
    ]
    with pytest.raises(GreenroomError) as e:  # a block type the role's content does not declare
        messages_api._message({"role": "user", "content": [{"type": "tool_use"}]}, 0, [], [])
    assert e.value.param == "messages[0].content[0]"


def test_a_shape_names_its_unread_keys():
    shape = contracts.Shape(fields={"a": contracts.Text(), "b": contracts.reported()})
    assert shape.read == {"a"} and shape.unread({"a": 1, "b": 2, "c": 3}) == ["b", "c"]
