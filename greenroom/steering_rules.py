"""How the coordinator turns a steering base and an intensity dial into strengths (spec:
"Intensity coupling" and "X-miLLM-Circuit-Rung"). Pure functions, no store, no actor: it owns
the dial rules, the server's limits, the evidence ladder (RUNGS) and the two headers' format.

- A **cluster** (a profile imported with `intensity_range` and a persistent dial) is applied as
  its stored strengths × λ. "min"/"max" are its declared range's ends within the [0, 2]
  envelope (undeclared: `cluster_min`, default 0.5, and the server's `max`); a numeric λ is
  capped at the range's top (or the server's max) but never raised: dialling down is honoured.
- A **circuit** (members per layer, each layer steered through the SAE attached there) takes
  one λ for every layer; λ is clamped at both ends into its range within [0, max] (undeclared:
  [`circuit_min`, default 0.0, max]); only an exact 0/"off" goes below the floor. Members are
  re-derived from the authored strengths at every change: the dial is absolute.
- A plain **profile**, or the live values, is dialled as a cluster without a declared range.
- λ = 0 ("off") turns the request's steering off without validating its base.
Every strength is clamped to ±STRENGTH_MAX after scaling, so at a high λ a strong member
saturates while weaker ones keep scaling.
"""

from __future__ import annotations

import math

import attrs

from greenroom import structured_fields as sf
from greenroom.engines.base import STRENGTH_MAX, Strengths
from greenroom.errors import GreenroomError

ENVELOPE = (0.0, 2.0)
SYMBOLS = ("off", "min", "max")
# the evidence ladder; rendered here, never per request: below rung 2 nothing is called causal
RUNGS = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}


@attrs.frozen
class Limits:
    """The server's configured intensity limits (config: cluster_intensity_min, circuit_intensity_min,
    intensity_max), within ENVELOPE."""

    cluster_min: float = 0.5  # CLUSTER_INTENSITY_MIN
    circuit_min: float = 0.0  # CIRCUIT_INTENSITY_MIN
    max: float = 2.0  # the server's maximum dial

    def __attrs_post_init__(self):
        if (
            not ENVELOPE[0]
            <= min(self.cluster_min, self.circuit_min)
            <= max(self.cluster_min, self.circuit_min)
            <= self.max
            <= ENVELOPE[1]
        ):
            raise ValueError(
                "intensity limits must satisfy 0 ≤ cluster_intensity_min, circuit_intensity_min ≤ "
                f"intensity_max ≤ 2 (got {self.cluster_min}, {self.circuit_min}, {self.max})"
            )


def cluster_bounds(declared: list[float] | None, limits: Limits) -> tuple[float, float]:
    """(what "min" means, the cap) of a cluster: its declared range within the envelope, else the
    server's floor and maximum."""
    if declared is None:
        return limits.cluster_min, limits.max
    return max(declared[0], ENVELOPE[0]), min(declared[1], ENVELOPE[1])


def circuit_bounds(declared: list[float] | None, limits: Limits) -> tuple[float, float]:
    """The clamp of a circuit's λ: its declared range within [0, the server's max], else
    [circuit_min, max]."""
    if declared is None:
        return limits.circuit_min, limits.max
    return max(declared[0], ENVELOPE[0]), min(declared[1], limits.max)


def cluster_lambda(dial: float | str | None, stored: float, declared: list[float] | None, limits: Limits) -> float:
    """λ for a cluster base: the request's `dial` (None: the persistent `stored` one)."""
    floor, cap = cluster_bounds(declared, limits)
    if dial is None:
        return min(stored, cap)
    if dial == "off":
        return 0.0
    if dial in ("min", "max"):
        return floor if dial == "min" else cap
    return min(float(dial), cap)  # down toward off is always honoured


def circuit_lambda(dial: float | str | None, stored: float, declared: list[float] | None, limits: Limits) -> float:
    """λ for a circuit base: clamped at both ends; only an exact 0/"off" is below the floor."""
    floor, cap = circuit_bounds(declared, limits)
    value = stored if dial is None else dial
    if value == "off" or value == 0:
        return 0.0
    if value in ("min", "max"):
        return floor if value == "min" else cap
    return max(floor, min(float(value), cap))


def scaled(strengths: dict[str, dict[str, float]], lam: float) -> dict[str, dict[str, float]]:
    """`strengths` × λ, each clamped to ±STRENGTH_MAX; zeros dropped (they steer nothing)."""
    out = {}
    for sae_id, features in strengths.items():
        live = {f: max(-STRENGTH_MAX, min(STRENGTH_MAX, s * lam)) for f, s in features.items() if s * lam}
        if live:
            out[sae_id] = live
    return out


def indexed(strengths: dict[str, dict[str, float]]) -> Strengths:
    """A strength document's features (decimal strings, as JSON keys them) as the indices an
    engine steers by: what crosses to the engine actors."""
    return {sae_id: {int(f): s for f, s in features.items()} for sae_id, features in strengths.items()}


def rung_header(rung: int) -> str:
    """X-miLLM-Circuit-Rung in RFC 8941 form: the rung, its phrase the parameter `language`."""
    return sf.item(rung, {"language": RUNGS[rung]}, spaced=True)


def intensity_header(lam: float) -> str:
    """X-miLLM-Steering-Intensity: the resolved λ (within [0, 2]), a whole one as an sf-integer."""
    return sf.bare(int(lam) if float(lam).is_integer() else float(lam))


def check_range(value, where: str) -> list[float] | None:
    """A document's intensity_range: [low, high] with 0 ≤ low ≤ high, meeting the [0, 2] envelope."""
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
        and 0 <= value[0] <= value[1]
        and value[0] <= ENVELOPE[1]
    ):
        raise GreenroomError(
            "invalid_parameter", f"'{where}' must be [low, high] with 0 ≤ low ≤ high and low ≤ {ENVELOPE[1]:g}", where
        )
    return [float(value[0]), float(value[1])]
