"""SAEs for the demo model, in SAELens' format: random, deterministic, built in well under
a second (tiny), so that steering and SAE readouts run on a fresh install with no download.

Two per size, on the residual stream after two middle blocks (a second layer for circuits):
`<cache>/models/greenroom-demo-sae-<size>/layer-<L>/`, the first `standard` (ReLU), the
second `jumprelu`, so both code paths of sae.py run. Built so that steering a feature
up raises that feature's own activation:

- decoder rows are unit-norm random directions that leave residual channel 0 alone (the
  demo model holds that channel at 1 as a per-token bias, demo_model.py);
- W_enc = W_decᵀ, so feature i's pre-activation is the residual's component along its own
  decoder direction: adding c·W_dec[i] raises it by exactly c;
- b_dec = e₀ (the residual's known mean), and b_enc sits two standard deviations down: the
  demo residual has unit variance per channel, so a component along a random unit
  direction is ~N(0, 1) and about 3 % of features fire per token (measured; the jumprelu SAE's
  threshold takes the same cut).
"""

from __future__ import annotations

from pathlib import Path

from ..built_dirs import ensure_built
from .demo_model import DEMO_MODEL_NAME, GENERATOR_VERSION, SIZES

DEMO_SAE_NAME = f"{DEMO_MODEL_NAME}-sae"
# bump when the generated files would change
SAE_GENERATOR_VERSION = 1
WIDTH_PER_DIM = 4  # default width: 4 × d_model
CUT = 2.0  # standard deviations below which a feature stays off


def demo_sae_layers(size: str = "tiny") -> tuple[int, int]:
    """The two blocks the demo SAEs read: the middle one and the one after it."""
    mid = SIZES[size]["num_hidden_layers"] // 2
    return mid - 1, mid


def demo_sae_dir(cache_dir: Path, size: str = "tiny", layer: int | None = None, width: int | None = None) -> Path:
    """Where a demo SAE lives (built or not); a non-default width has its own directory."""
    layer = demo_sae_layers(size)[0] if layer is None else layer
    suffix = "" if width in (None, _default_width(size)) else f"-w{width}"
    return Path(cache_dir) / f"{DEMO_SAE_NAME}-{size}" / f"layer-{layer}{suffix}"


def ensure_demo_sae(cache_dir: Path, size: str = "tiny", layer: int | None = None, width: int | None = None) -> Path:
    """The demo SAE for `layer` (default: the first of demo_sae_layers) of the demo model of
    `size`, `width` features wide (default 4 × d_model); built on first use."""
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(SIZES)}")
    layer = demo_sae_layers(size)[0] if layer is None else layer
    if not 0 <= layer < SIZES[size]["num_hidden_layers"]:
        raise ValueError(f"the {size} demo model has no layer {layer}")
    width = width or _default_width(size)
    marker = {
        "generator_version": GENERATOR_VERSION,
        "sae_generator_version": SAE_GENERATOR_VERSION,
        "size": size,
        "layer": layer,
        "width": width,
    }
    return ensure_built(
        demo_sae_dir(cache_dir, size, layer, width), marker, lambda out: _write(out, size, layer, width)
    )


def _default_width(size: str) -> int:
    return WIDTH_PER_DIM * SIZES[size]["hidden_size"]


def _write(out_dir: Path, size: str, layer: int, width: int) -> None:
    import torch

    from ..sae import SAE, save_sae

    d = SIZES[size]["hidden_size"]
    architecture = "standard" if layer == demo_sae_layers(size)[0] else "jumprelu"
    gen = torch.Generator().manual_seed(1000 * layer + width)
    w_dec = torch.randn(width, d, generator=gen)
    w_dec[:, 0] = 0.0
    w_dec /= w_dec.norm(dim=1, keepdim=True)
    b_dec = torch.zeros(d)
    b_dec[0] = 1.0
    weights = {"W_enc": w_dec.T.contiguous(), "W_dec": w_dec, "b_dec": b_dec}
    if architecture == "standard":
        weights["b_enc"] = torch.full((width,), -CUT)
    else:  # the same cut, taken by the threshold: activations start at CUT instead of 0
        weights["b_enc"] = torch.zeros(width)
        weights["threshold"] = torch.full((width,), CUT)
    sae = SAE(weights, architecture=architecture, hook_name=f"blocks.{layer}.hook_resid_post")
    save_sae(
        out_dir,
        sae,
        {
            "model_name": f"{DEMO_MODEL_NAME}-{size}",
            "prepend_bos": True,
            "context_size": SIZES[size]["max_position_embeddings"],
        },
    )
