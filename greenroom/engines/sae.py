"""Sparse autoencoders in SAELens' on-disk format, read with safetensors (no sae_lens).

A directory holds `cfg.json` and `sae_weights.safetensors` with W_enc [d_in, d_sae],
W_dec [d_sae, d_in], b_enc [d_sae], b_dec [d_in] and, for JumpReLU, threshold [d_sae].
SAELens v6 keeps the hook under `metadata` (`meta` in some 6.x releases), older dumps at
the top level; every one of them is read. Supported, as SAELens computes them:

    standard:  acts = relu((x − b_dec·apply_b_dec_to_input) @ W_enc + b_enc)
    jumprelu:  pre  = (x − b_dec·apply_b_dec_to_input) @ W_enc + b_enc
               acts = relu(pre) · [pre > threshold]
    decode:    x̂ = acts @ W_dec + b_dec

`normalize_activations` "none" or "expected_average_only_in" (SAELens folds that factor
into the weights when it saves, and applies nothing at inference); the run-time
normalisations (constant_norm_rescale, layer_norm), hook_z reshaping, gated, top-k and
other architectures are refused with SAEFormatError naming what the file asks for.
Hook points (`SITES`): `blocks.L.hook_resid_post` is the output of decoder block L;
`blocks.L.hook_resid_pre` (L ≥ 1) the output of block L − 1; `blocks.L.hook_attn_out` and
`blocks.L.hook_mlp_out` the output of block L's attention and MLP (what is added to the
residual stream there). Which of them an engine serves is its own (engines/capabilities.py
HOOK_SITES); other hooks (hook_z, hook_mlp_in, …) are refused here, naming the hook.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "jumprelu")
_HOOK = re.compile(r"^blocks\.(\d+)\.hook_(resid_post|resid_pre|attn_out|mlp_out)$")
# where a hook point reads, by its site: the residual stream after a block, or one of its two
# sublayers' outputs
SITES = {
    "resid_post": "the residual stream after block {block}",
    "resid_pre": "the residual stream after block {block} (before block {layer})",
    "attn_out": "block {block}'s attention output",
    "mlp_out": "block {block}'s MLP output",
}
# SAELens applies nothing for these at inference; the other values it knows are run-time maps
_NORMALIZE_NOOP = ("none", "expected_average_only_in")


class SAEFormatError(ValueError):
    """A directory that is not an SAE greenroom can run, and why."""


class SAE:
    """One SAE's weights (float32 unless moved) and what it was trained on."""

    def __init__(
        self, weights: dict[str, torch.Tensor], *, architecture: str, hook_name: str, apply_b_dec_to_input: bool = True
    ):
        self.W_enc, self.W_dec = weights["W_enc"], weights["W_dec"]
        self.b_enc, self.b_dec = weights["b_enc"], weights["b_dec"]
        self.threshold = weights.get("threshold")
        self.architecture = architecture
        self.hook_name = hook_name
        self.apply_b_dec_to_input = apply_b_dec_to_input
        m = _HOOK.match(hook_name)
        self.layer = int(m.group(1))  # SAELens' layer number, as the hook names it
        self.site = m.group(2)  # resid_post | resid_pre | attn_out | mlp_out
        # the decoder block it reads (its output, or its attention's or MLP's)
        self.block = self.layer - 1 if self.site == "resid_pre" else self.layer

    @property
    def residual(self) -> bool:
        """Whether it reads the residual stream (a block's output), not a sublayer's output."""
        return self.site.startswith("resid_")

    @property
    def reads(self) -> str:
        """What its hook point reads, in words (the SAE's description)."""
        return SITES[self.site].format(block=self.block, layer=self.layer)

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> SAE:
        weights = {k: getattr(self, k) for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")}
        return SAE(
            {k: v.to(device, dtype) for k, v in weights.items() if v is not None},
            architecture=self.architecture,
            hook_name=self.hook_name,
            apply_b_dec_to_input=self.apply_b_dec_to_input,
        )

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations [..., d_sae] of residual vectors [..., d_in] (computed in the SAE's dtype)."""
        x = x.to(self.W_enc.dtype)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        acts = torch.relu(pre)
        if self.threshold is not None:
            acts = acts * (pre > self.threshold)
        return acts

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec


def load_sae(path: str | Path) -> SAE:
    """Read an SAELens directory; SAEFormatError says what is missing or unsupported."""
    path = Path(path)
    try:
        cfg = json.loads((path / CFG_FILE).read_text())
    except FileNotFoundError:
        raise SAEFormatError(f"{path} has no {CFG_FILE} (an SAELens SAE is {CFG_FILE} + {WEIGHTS_FILE})") from None
    except ValueError as exc:
        raise SAEFormatError(f"{path / CFG_FILE} is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise SAEFormatError(f"{path / CFG_FILE} is not a JSON object")
    meta = cfg.get("metadata") or cfg.get("meta") or {}
    architecture = cfg.get("architecture", "standard")  # SAELens' default for dumps that predate the field
    if architecture not in ARCHITECTURES:
        raise SAEFormatError(
            f"SAE architecture {architecture!r} is not supported (greenroom runs {list(ARCHITECTURES)})"
        )
    activation = cfg.get("activation_fn_str", cfg.get("activation_fn", "relu"))
    if activation != "relu":
        raise SAEFormatError(f"SAE activation {activation!r} is not supported (greenroom runs relu and jumprelu)")
    for key, allowed in (("normalize_activations", _NORMALIZE_NOOP), ("reshape_activations", ("none",))):
        value = cfg.get(key) or "none"
        if value not in allowed:
            raise SAEFormatError(f"SAE {key} {value!r} is not supported (greenroom runs {list(allowed)})")
    if cfg.get("finetuning_scaling_factor"):
        raise SAEFormatError("SAE finetuning_scaling_factor is not supported")
    hook_name = meta.get("hook_name") or cfg.get("hook_name")
    m = _HOOK.match(hook_name or "")
    if not m or (m.group(2) == "resid_pre" and m.group(1) == "0"):
        raise SAEFormatError(
            f"SAE hook {hook_name!r} is not a hook point greenroom can attach (blocks.L.hook_resid_post, "
            "blocks.L.hook_resid_pre with L ≥ 1, blocks.L.hook_attn_out, blocks.L.hook_mlp_out)"
        )
    try:
        d_in, d_sae = int(cfg["d_in"]), int(cfg["d_sae"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SAEFormatError(f"{path / CFG_FILE} lacks an integer {exc}") from None

    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
    if architecture == "jumprelu":
        shapes["threshold"] = (d_sae,)
    try:
        with safe_open(path / WEIGHTS_FILE, framework="pt") as f:
            missing = [name for name in shapes if name not in f.keys()]
            if missing:
                raise SAEFormatError(f"{path / WEIGHTS_FILE} lacks {', '.join(missing)} ({architecture} SAE)")
            weights = {name: f.get_tensor(name).float() for name in shapes}
    except FileNotFoundError:
        raise SAEFormatError(f"{path} has no {WEIGHTS_FILE}") from None
    except SAEFormatError:
        raise
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise SAEFormatError(f"{path / WEIGHTS_FILE} cannot be read: {exc}") from None
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise SAEFormatError(
                f"{name} has shape {list(weights[name].shape)}; cfg.json's d_in {d_in} and "
                f"d_sae {d_sae} make it {list(shape)}"
            )
    return SAE(
        weights,
        architecture=architecture,
        hook_name=hook_name,
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
    )


def save_sae(path: str | Path, sae: SAE, metadata: dict | None = None) -> Path:
    """Write `sae` as SAELens v6 writes an inference SAE (cfg.json with `metadata`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {"W_enc": sae.W_enc, "W_dec": sae.W_dec, "b_enc": sae.b_enc, "b_dec": sae.b_dec}
    if sae.threshold is not None:
        tensors["threshold"] = sae.threshold
    save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}, path / WEIGHTS_FILE)
    cfg = {
        "architecture": sae.architecture,
        "d_in": sae.d_in,
        "d_sae": sae.d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": sae.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"hook_name": sae.hook_name, "hook_layer": sae.layer, "hook_head_index": None, **(metadata or {})},
    }
    (path / CFG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    return path
