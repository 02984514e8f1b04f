"""docs/engines.md's capability table says what greenroom/engines/capabilities.py says. No server."""

from __future__ import annotations

import re

from conftest import ROOT

from greenroom.engines.capabilities import ENGINES

# the table's rows, in order: the capability fields each one stands for
ROWS = [
    "seed",
    "n",
    "penalties",
    "embeddings",
    "chat_template_kwargs",
    "scoring",
    "response_format",
    "tools",
    "steering",
    "profile",
    "sae_activations",
    "token_logprobs",
]


def test_the_engines_page_table_matches_the_capability_table():
    text = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    header = re.search(r"^\| capability \|(.*)\|$", text, re.M)
    engines = [c.strip() for c in header[1].split("|")]
    assert engines == list(ENGINES)
    rows = re.findall(r"^\| [^|]+ \|((?: (?:yes|no) \|)+)$", text[header.end() :], re.M)
    assert len(rows) == len(ROWS)
    for field, row in zip(ROWS, rows):
        said = [c.strip() == "yes" for c in row.strip(" |").split("|")]
        assert said == [getattr(ENGINES[e], field) for e in engines], field


# docs/openai.md's parameter rows that name the engines serving a field: capability → the row's first cell
PARAMETER_ROWS = {"profile": "`profile`, `steering_intensity`", "sae_activations": "`return_sae_activations`"}
ENGINE_NAMES = {"transformers": "transformers", "llama.cpp": "GGUF", "openvino": "OpenVINO"}


def test_the_openai_page_names_the_engines_that_serve_steering_fields():
    text = (ROOT / "docs" / "openai.md").read_text(encoding="utf-8")
    for field, cell in PARAMETER_ROWS.items():
        row = re.search(rf"^\| {re.escape(cell)} \| (.*) \|$", text, re.M)[1]
        served = re.search(r"on ([\w. ]+?) models", row)[1]  # "on transformers and GGUF models"
        refused = re.search(r"refused on [^|]*?(\w+) models", row)[1]
        for engine, name in ENGINE_NAMES.items():
            assert (name in served) == getattr(ENGINES[engine], field), (field, name, row)
            assert (name == refused) == (not getattr(ENGINES[engine], field)), (field, name, row)


def test_an_engine_that_scores_reports_token_logprobs():
    """The ledger lets `logprobs` through on token_logprobs (a generation's tokens); a scoring
    request's `logprobs` relies on every engine that scores reporting tokens too."""
    assert all(c.token_logprobs for c in ENGINES.values() if c.scoring)
