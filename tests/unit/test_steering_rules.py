"""The steering rules (greenroom/steering_rules.py) as pure functions: the dial of a
cluster and of a circuit, scaling and its clamp, the limits, the range check (spec:
"Intensity coupling"). No server, no store."""

from __future__ import annotations

import pytest

from greenroom import steering_rules as rules
from greenroom.errors import GreenroomError
from greenroom.steering_rules import Limits

LIMITS = Limits()  # cluster_min 0.5, circuit_min 0, max 2


@pytest.mark.parametrize(
    "dial,stored,declared,expected",
    [
        (None, 1.0, None, 1.0),  # the persistent dial
        (None, 1.8, [0.5, 1.5], 1.5),  # a stored dial past the declared top is capped
        ("off", 1.0, [0.5, 1.5], 0.0),
        ("min", 1.0, [0.7, 1.5], 0.7),
        ("max", 1.0, [0.7, 1.5], 1.5),
        ("min", 1.0, None, 0.5),
        ("max", 1.0, None, 2.0),  # undeclared: the server's floor and max
        (0.2, 1.0, [0.5, 1.5], 0.2),  # dialling down below the range is honoured for a cluster
        (1.9, 1.0, [0.5, 1.5], 1.5),  # up is capped
        (0, 1.0, None, 0.0),
    ],
)
def test_cluster_lambda(dial, stored, declared, expected):
    assert rules.cluster_lambda(dial, stored, declared, LIMITS) == expected


@pytest.mark.parametrize(
    "dial,stored,declared,expected",
    [
        (None, 1.0, None, 1.0),
        (0.2, 1.0, [0.5, 1.5], 0.5),  # a circuit clamps at both ends
        (1.9, 1.0, [0.5, 1.5], 1.5),
        (0, 1.0, [0.5, 1.5], 0.0),
        ("off", 1.0, [0.5, 1.5], 0.0),  # only an exact 0 / off goes below the floor
        ("min", 1.0, [0.5, 1.5], 0.5),
        ("max", 1.0, None, 2.0),
        ("min", 1.0, None, 0.0),
        (None, 0.1, [0.5, 1.5], 0.5),  # the stored dial is clamped as a request's is
    ],
)
def test_circuit_lambda(dial, stored, declared, expected):
    assert rules.circuit_lambda(dial, stored, declared, LIMITS) == expected


def test_a_circuit_range_is_capped_by_the_servers_max():
    limits = Limits(max=1.2)
    assert rules.circuit_bounds([0.5, 1.8], limits) == (0.5, 1.2)
    assert rules.circuit_lambda("max", 1.0, [0.5, 1.8], limits) == 1.2


def test_scaling_clamps_each_strength_and_drops_zeros():
    out = rules.scaled({"sae": {"1": 150.0, "2": -40.0, "3": 0.0}}, 2.0)
    assert out == {"sae": {"1": 200.0, "2": -80.0}}  # 300 saturates at +200; a zero steers nothing
    assert rules.scaled({"sae": {"1": 10.0}}, 0.0) == {}


@pytest.mark.parametrize(
    "bad", [dict(cluster_min=-0.1), dict(max=2.5), dict(cluster_min=1.5, max=1.0), dict(circuit_min=1.1, max=1.0)]
)
def test_limits_outside_the_envelope_stop_the_start(bad):
    with pytest.raises(ValueError):
        Limits(**bad)


@pytest.mark.parametrize("value", [[0.5, 1.5], [0, 0], [2, 3]])
def test_a_range_within_the_envelope(value):
    assert rules.check_range(value, "intensity_range") == [float(v) for v in value]


@pytest.mark.parametrize("value", [[1.5, 0.5], [-0.1, 1], [2.1, 3], [1], "0.5,1", [0.5, float("nan")], [True, 1]])
def test_a_range_outside_it_is_a_typed_400(value):
    with pytest.raises(GreenroomError) as e:
        rules.check_range(value, "intensity_range")
    assert e.value.code == "invalid_parameter" and e.value.param == "intensity_range"


def test_the_rung_ladder_never_calls_below_rung_2_causal():
    assert all("causal" not in rules.RUNGS[r] for r in (0, 1))
    assert rules.rung_header(2) == '2; language="causally validated (edge)"'
