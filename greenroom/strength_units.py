"""The two units a steering strength may be given in, and the conversion between them (pure).

- a number (the default, the spec's scale): a strength s in ±200 adds (ρ_L / 100) · s along the
  feature's *unit* decoder direction, ρ_L being the calibrated residual norm of the SAE's hook
  point (engines/steering.py): s is a percentage of the typical norm there;
- `{"coefficient": c}` (SAELens' and Neuronpedia's convention): c · W_dec[i] is added, the
  decoder row as the SAE stores it, whatever its norm.

So s = 100 · c · ‖W_dec[i]‖ / ρ_L. Strengths are stored and applied in the spec's scale; a
coefficient is converted when it is written (the coordinator knows ρ_L once an engine has
measured it, and ‖W_dec[i]‖ from the SAE's file), and must land within ±200 like any strength.
"""

from __future__ import annotations

import math

from greenroom.engines.base import STRENGTH_MAX
from greenroom.errors import GreenroomError


def to_percent(coefficient: float, residual_norm: float, decoder_norm: float) -> float:
    """The spec-scale strength adding what `coefficient` · W_dec[i] adds."""
    return 100.0 * coefficient * decoder_norm / residual_norm


def to_coefficient(strength: float, residual_norm: float, decoder_norm: float) -> float:
    """The SAELens coefficient adding what the spec-scale `strength` adds."""
    return strength * residual_norm / (100.0 * decoder_norm)


def converted(
    sae_id: str,
    coefficients: dict[str, float],
    residual_norm: float | None,
    decoder_norms,
    param: str,
    per_feature: bool = True,
) -> dict[str, float]:
    """One SAE's {feature: coefficient} as {feature: strength}: refused (400) while the SAE's
    residual norm is not measured yet, for a feature whose decoder row is zero (it adds nothing
    at any coefficient) and for a coefficient past ±200 once converted. A refusal names `param`
    (with `per_feature`, `param.<feature>` for a feature's)."""
    if residual_norm is None:
        raise GreenroomError(
            "invalid_parameter",
            f"SAE {sae_id!r}'s residual norm is not measured yet (it is, once its model is loaded: "
            "POST /api/models/load), so a coefficient cannot be converted; give the strength as a number",
            param,
        )
    out = {}
    for feature, coefficient in coefficients.items():
        norm = float(decoder_norms[int(feature)])
        where = f"{param}.{feature}" if per_feature else param
        if norm == 0:
            raise GreenroomError(
                "invalid_parameter", f"feature {feature} of SAE {sae_id!r} has a zero decoder row", where
            )
        strength = to_percent(coefficient, residual_norm, norm)
        if not (math.isfinite(strength) and abs(strength) <= STRENGTH_MAX):
            bound = to_coefficient(STRENGTH_MAX, residual_norm, norm)
            raise GreenroomError(
                "invalid_parameter",
                f"the coefficient {coefficient:g} of {where} is a strength of {strength:g}: strengths are in "
                f"±{STRENGTH_MAX:g}, so this feature's coefficients are in ±{bound:.6g}",
                where,
            )
        out[feature] = strength
    return out
