"""greenroom's RFC 8941 serialiser (greenroom/structured_fields.py) read back by an independent
parser, http-sf: every header form greenroom sends. No server needed."""

from __future__ import annotations

import http_sf
import pytest

from greenroom import steering_rules
from greenroom import structured_fields as sf
from greenroom.http.core import ledger


def parse(value: str, kind: str):
    return http_sf.parse(value.encode("ascii"), tltype=kind)


def test_ignored_fields_a_list_of_strings_percent_encoded():
    names = ["foo", "messages[2].name", 'q"uote', "back\\slash", "größe", "100%"]
    assert [v for v, _ in parse(ledger.ignored_fields_header(names), "list")] == [
        "foo",
        "messages[2].name",
        'q"uote',
        "back\\slash",
        "gr%C3%B6%C3%9Fe",
        "100%25",
    ]


def test_ignored_fields_capped_with_plus_n_more():
    value = ledger.ignored_fields_header([f"field_{i:04d}" for i in range(500)])
    items = [v for v, _ in parse(value, "list")]
    assert len(value) <= ledger.IGNORED_FIELDS_HEADER_MAX_BYTES
    assert items[-1] == f"+{500 - (len(items) - 1)} more"


@pytest.mark.parametrize("scope", ["request", "batch-shape", "best-effort"])
@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
def test_seed_an_integer_with_its_scope(seed, scope):
    value = sf.item(seed, {"scope": scope})
    assert value == f'{seed};scope="{scope}"'  # the spec's form, verbatim
    assert parse(value, "item") == (seed, {"scope": scope})


@pytest.mark.parametrize("rung", sorted(steering_rules.RUNGS))
def test_rung_an_integer_with_its_phrase(rung):
    value = steering_rules.rung_header(rung)
    assert parse(value, "item") == (rung, {"language": steering_rules.RUNGS[rung]})
    if rung == 2:
        assert value == '2; language="causally validated (edge)"'  # the spec's example, verbatim


@pytest.mark.parametrize(
    "lam,written", [(0.0, "0"), (1.0, "1"), (0.5, "0.5"), (1.6, "1.6"), (0.1234, "0.123"), (2.0, "2")]
)
def test_intensity_an_integer_or_a_decimal(lam, written):
    value = steering_rules.intensity_header(lam)
    assert value == written and float(parse(value, "item")[0]) == float(written)


def test_truncated_a_dictionary_of_integers():
    value = sf.dictionary({"messages": 3, "tokens": 0})
    assert parse(value, "dictionary") == {"messages": (3, {}), "tokens": (0, {})}


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 1e12, 10**15, object()])
def test_what_has_no_structured_form_is_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        sf.bare(bad)
