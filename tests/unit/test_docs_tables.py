"""The docs' tables that restate declarations are written from them (greenroom/http/docs_tables.py):
a page that differs from what `make docs` writes fails here, naming the command."""

import attrs
import pytest

from greenroom.http import docs_tables
from greenroom.http.core import contracts
from greenroom.http.openai import openai_api


@pytest.mark.parametrize("page", docs_tables.TABLES)
def test_each_docs_table_is_what_the_declarations_write(page):
    text = (docs_tables.DOCS / page).read_text(encoding="utf-8")
    assert text == docs_tables.generated(page), f"docs/{page} is not what its declarations write: run `make docs`"


def test_each_chat_and_completion_field_has_one_row():
    named = [name.split(".")[0] for names in docs_tables.rows() for name in names]
    assert len(named) == len(set(named))
    assert set(named) == set(openai_api.CHAT.fields) | set(openai_api.COMPLETION.fields)


def test_a_field_added_to_the_declaration_gets_its_row(monkeypatch):
    """The acceptance's last step: a chat field declared with its description and rule is in the
    table `make docs` writes, described as /openapi.json describes it."""
    field = contracts.Number(
        lo=0, hi=20, integer=True, description="How many", rule=contracts.needs("token_logprobs", 0)
    )
    chat = attrs.evolve(openai_api.CHAT, fields={**openai_api.CHAT.fields, "prompt_logprobs": field})
    monkeypatch.setattr(openai_api, "CHAT", chat)
    row = docs_tables.parameters().splitlines()[-1]
    assert row.startswith("| `prompt_logprobs` | How many. Refused with 400 field_not_honoured unless null or 0 by")
    assert row.endswith("| — |")
    assert chat.render({})["properties"]["prompt_logprobs"]["description"] in row
