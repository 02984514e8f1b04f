"""Generated SAEs for any model's residual stream, in SAELens' format. **Random directions,
not learned features**: they exist so that steering, SAE readouts and monitoring run on a
real model (the default config's SmolLM2) on a fresh install, where no trained SAE can be
downloaded. A feature's activation says which way the residual points, nothing about what
the model represents.

Source `random:<d_in>:<layer>` (the `sae` config key, POST /api/saes/attach): 4 × d_in
features reading `blocks.<layer>.hook_resid_post`, built on first use (milliseconds) under
`<cache>/models/greenroom-random-sae/d<d_in>/layer-<layer>/`, the same bytes every time.

- decoder rows: unit-norm random directions (seeded by d_in and layer);
- W_enc = W_decᵀ, b_enc = b_dec = 0, architecture `standard`: feature i's activation is the
  positive part of the residual's component along its direction, so about half the
  features are active at any position, and steering feature i up (steering.py adds along
  its direction, scaled by the layer's residual norm) raises its own activation.
"""

from __future__ import annotations

from pathlib import Path

from .built_dirs import ensure_built

PREFIX = "random:"
RANDOM_SAE_NAME = "greenroom-random-sae"
# bump when the generated files would change
GENERATOR_VERSION = 1
WIDTH_PER_DIM = 4
# built before the model's shape is checked (steering_actor._resolve_sae): a bound on what one
# request can make it write (8192 wide: 32,768 features, 1 GiB)
MAX_D_IN, MAX_LAYER = 8192, 1024


def ensure_random_sae(cache_dir: Path, source: str) -> tuple[Path, str]:
    """The directory of the `random:<d_in>:<layer>` SAE (built on first use) and its default
    sae_id. ValueError for a malformed source."""
    d_in, layer = _parse(source)
    width = WIDTH_PER_DIM * d_in
    out = Path(cache_dir) / RANDOM_SAE_NAME / f"d{d_in}" / f"layer-{layer}"
    marker = {"generator_version": GENERATOR_VERSION, "d_in": d_in, "layer": layer, "width": width}
    return ensure_built(out, marker, lambda tmp: _write(tmp, d_in, layer, width)), f"sae_random_d{d_in}_l{layer}"


def _parse(source: str) -> tuple[int, int]:
    d_in, _, layer = source[len(PREFIX) :].partition(":")
    if not (d_in.isdigit() and layer.isdigit() and 0 < int(d_in) <= MAX_D_IN and int(layer) < MAX_LAYER):
        raise ValueError(
            f"{source!r} is not random:<d_in>:<layer> with d_in 1-{MAX_D_IN} and layer below "
            f"{MAX_LAYER} (e.g. random:576:15)"
        )
    return int(d_in), int(layer)


def _write(out_dir: Path, d_in: int, layer: int, width: int) -> None:
    import torch

    from .sae import SAE, save_sae

    gen = torch.Generator().manual_seed(d_in * 1_000 + layer)
    w_dec = torch.randn(width, d_in, generator=gen)
    w_dec /= w_dec.norm(dim=1, keepdim=True)
    weights = {"W_enc": w_dec.T.contiguous(), "W_dec": w_dec, "b_enc": torch.zeros(width), "b_dec": torch.zeros(d_in)}
    sae = SAE(weights, architecture="standard", hook_name=f"blocks.{layer}.hook_resid_post")
    save_sae(out_dir, sae, {"note": "random directions, not learned features (greenroom/engines/random_sae.py)"})
