"""Strength units (greenroom/strength_units.py): the spec's percent scale and SAELens'
coefficient convert into each other through ρ_L and ‖W_dec[i]‖, and a coefficient that cannot be
converted, or lands past ±200, is a typed 400. SAE hook points (engines/sae.py): which sites
parse, what each reads, and the hook points each engine serves (capabilities.py). No server."""

from __future__ import annotations

import math

import pytest
import torch

from greenroom.engines.base import STRENGTH_MAX
from greenroom.engines.capabilities import ENGINES, common
from greenroom.engines.sae import SAE, SAEFormatError, load_sae, save_sae
from greenroom.errors import GreenroomError
from greenroom.http.docs_tables import HOOK_POINTS, capabilities, hook_points
from greenroom.strength_units import converted, to_coefficient, to_percent

RHO = 173.93  # SmolLM2's residual norm after block 15 (bench/steering_units.py)


def test_a_coefficient_adds_what_its_strength_adds():
    """delta = (ρ/100) · s · W/‖W‖ (engines/steering.py) equals c · W for s = to_percent(c)."""
    row = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ‖W‖ = 5
    c = 0.8
    s = to_percent(c, RHO, float(row.norm()))
    assert s == pytest.approx(100 * 0.8 * 5 / RHO)
    assert torch.allclose(RHO / 100 * s * row / row.norm(), c * row)
    assert to_coefficient(s, RHO, 5.0) == pytest.approx(c)
    assert to_coefficient(1, RHO, 1.0) == pytest.approx(1.7393)  # a strength of 1 on a unit decoder row


def test_converted_maps_each_feature_through_its_own_decoder_norm():
    norms = [1.0, 2.0, 0.5]
    out = converted("sae", {"0": 1.0, "1": 1.0, "2": -1.0}, 50.0, norms, "strengths.sae")
    assert out == {"0": 2.0, "1": 4.0, "2": -1.0}


@pytest.mark.parametrize(
    "coefficients, rho, norms, per_feature, param, says",
    [
        ({"0": 1.0}, None, [1.0], True, "strengths.sae", "not measured yet"),
        ({"1": 1.0}, 50.0, [1.0, 0.0], True, "strengths.sae.1", "zero decoder row"),
        ({"0": 101.0}, 50.0, [1.0], True, "strengths.sae.0", "coefficients are in ±100"),
        ({"0": -101.0}, 50.0, [1.0], False, "members", "strength of -202"),
        ({"0": math.inf}, 50.0, [1.0], True, "strengths.sae.0", "strengths are in"),
    ],
)
def test_a_coefficient_that_cannot_steer_is_a_typed_400(coefficients, rho, norms, per_feature, param, says):
    where = "strengths.sae" if per_feature else "members"
    with pytest.raises(GreenroomError) as err:
        converted("sae", coefficients, rho, norms, where, per_feature=per_feature)
    assert (err.value.code, err.value.status, err.value.param) == ("invalid_parameter", 400, param)
    assert says in err.value.message


def test_the_range_end_converts_exactly():
    bound = to_coefficient(STRENGTH_MAX, 50.0, 1.0)
    assert converted("sae", {"0": bound}, 50.0, [1.0], "strengths.sae") == {"0": STRENGTH_MAX}


def _sae(hook: str) -> SAE:
    return SAE(
        {"W_enc": torch.eye(4), "W_dec": torch.eye(4), "b_enc": torch.zeros(4), "b_dec": torch.zeros(4)},
        architecture="standard",
        hook_name=hook,
    )


@pytest.mark.parametrize(
    "hook, site, block, reads",
    [
        ("blocks.3.hook_resid_post", "resid_post", 3, "the residual stream after block 3"),
        ("blocks.3.hook_resid_pre", "resid_pre", 2, "the residual stream after block 2 (before block 3)"),
        ("blocks.3.hook_attn_out", "attn_out", 3, "block 3's attention output"),
        ("blocks.3.hook_mlp_out", "mlp_out", 3, "block 3's MLP output"),
    ],
)
def test_hook_points_parse_to_a_site_a_block_and_words(hook, site, block, reads, tmp_path):
    sae = load_sae(save_sae(tmp_path, _sae(hook)))
    assert (sae.site, sae.block, sae.layer, sae.reads, sae.residual) == (
        site,
        block,
        3,
        reads,
        site.startswith("resid"),
    )


@pytest.mark.parametrize("hook", ["blocks.3.hook_z", "blocks.3.hook_mlp_in", "blocks.0.hook_resid_pre", "embed"])
def test_other_hooks_are_refused_naming_the_hook(hook, tmp_path):
    save_sae(tmp_path, _sae("blocks.3.hook_resid_post"))
    cfg = (tmp_path / "cfg.json").read_text().replace("blocks.3.hook_resid_post", hook)
    (tmp_path / "cfg.json").write_text(cfg)
    with pytest.raises(SAEFormatError, match=f"'{hook}' is not a hook point"):
        load_sae(tmp_path)


def test_each_engine_says_its_hook_points_and_the_table_shows_them():
    assert ENGINES["transformers"].hook_sites == ("resid_post", "resid_pre", "attn_out", "mlp_out")
    assert ENGINES["llama.cpp"].hook_sites == ("resid_post", "resid_pre")
    assert ENGINES["openvino"].hook_sites == ()
    assert common(("transformers", "llama.cpp")).hook_sites == ("resid_post", "resid_pre")
    row = capabilities().splitlines()[-1]
    assert row.startswith(f"| {HOOK_POINTS} |") and hook_points(ENGINES["llama.cpp"].hook_sites) in row


@pytest.mark.parametrize(
    "hook, placement, says",
    [
        ("blocks.3.hook_attn_out", {"engine": "transformers", "device": "cpu"}, None),
        ("blocks.3.hook_mlp_out", {"engine": "transformers", "device": "cpu", "fixed_shape": "off"}, None),
        ("blocks.3.hook_resid_post", {"engine": "transformers", "device": "cuda:0"}, None),
        ("blocks.3.hook_attn_out", {"engine": "transformers", "device": "cuda:0"}, "decodes in fixed shapes"),
        ("blocks.3.hook_mlp_out", {"engine": "transformers", "device": "cpu", "fixed_shape": "on"}, "fixed shapes"),
        ("blocks.3.hook_attn_out", {"engine": "transformers", "device": "cuda:0", "fixed_shape": "off"}, None),
        ("blocks.3.hook_resid_pre", {"engine": "llama.cpp", "device": "cpu"}, None),
        ("blocks.3.hook_mlp_out", {"engine": "llama.cpp", "device": "cpu"}, "resid_post, resid_pre hook points only"),
    ],
)
def test_the_coordinator_refuses_a_hook_point_the_placement_cannot_steer(hook, placement, says):
    from greenroom.actors.steering_actor import _unservable_site

    why = _unservable_site(_sae(hook), placement)
    assert why is None if says is None else (hook in why and says in why)
