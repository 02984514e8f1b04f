"""Scoring's reductions (engines/scoring.py), engine-free: a row of logits to the float64
log-softmax, its top entries and an allowed set renormalised; the non-finite rules, for a
row and for a prompt's tokens (tests/live/test_scoring.py and test_gguf_scoring.py: through
servers, against torch and llama.cpp)."""

from __future__ import annotations

import numpy as np
import pytest

from greenroom.engines.base import EngineError
from greenroom.engines.scoring import prompt_tokens, score_row


def test_score_row_is_the_float64_log_softmax():
    row = np.random.default_rng(1).normal(size=50).astype(np.float32) * 4
    scored = score_row(row, 50, 0.0, None, 5)
    wide = row.astype(np.float64)
    expected = wide - wide.max() - np.log(np.exp(wide - wide.max()).sum())
    assert [i for i, _ in scored.top] == list(np.argsort(-expected)[:5])
    assert max(abs(lp - expected[i]) for i, lp in scored.top) < 1e-12
    assert scored.token_id == int(np.argmax(row)) and scored.logprob == scored.top[0][1]
    only = score_row(row, 50, 2.0, [7, 3, 7], 2)  # duplicates count once; renormalised over the set
    assert {i for i, _ in only.top} == {3, 7}
    assert sum(np.exp([lp for _, lp in only.top])) == pytest.approx(1.0, abs=1e-12)
    assert score_row(row, 40, 0.0, None, 3).token_id < 40  # rows past the vocabulary are not tokens


def test_the_non_finite_rules():
    row = np.zeros(10, dtype=np.float32)
    row[3], row[4] = np.inf, -np.inf
    for allowed, report in ((None, 1), ([3, 5], 2)):  # +inf anywhere unrestricted, or on an allowed token
        with pytest.raises(EngineError) as exc:
            score_row(row, 10, 0.0, allowed, report)
        assert exc.value.code == "non_finite_logits"
    with pytest.raises(EngineError) as exc:  # -inf reported
        score_row(row, 10, 0.0, [4, 5], 2)
    assert exc.value.code == "non_finite_logits"
    assert score_row(row, 10, 0.0, [5, 6], 2).top  # ±inf outside the set is fine
    assert score_row(row, 10, 0.0, [4, 5], 1).token_id == 5  # -inf allowed but not reported
    rows = np.zeros((3, 10), dtype=np.float32)
    rows[1, 2] = np.nan
    with pytest.raises(EngineError) as exc:
        prompt_tokens(rows, [1, 1, 1], 10, 0.0, 2)
    assert exc.value.code == "non_finite_logits" and "prompt token 2" in exc.value.message
    rows[1, 2], rows[2, 5] = 0, -np.inf
    with pytest.raises(EngineError) as exc:  # a prompt token at -inf is reported
        prompt_tokens(rows, [1, 1, 5], 10, 0.0, 0)
    assert exc.value.code == "non_finite_logits"
    with pytest.raises(EngineError) as exc:
        prompt_tokens(rows, [1, 12, 1], 10, 0.0, 0)
    assert exc.value.code == "invalid_scoring_request"
