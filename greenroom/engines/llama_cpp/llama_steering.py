"""Steering, SAE readouts and monitors on a llama.cpp model (llama_cpp_engine.py), with the
formula, units and rules of every engine (steering.py).

llama.cpp adds a *control vector* to the output of chosen layers (`llama_set_adapter_cvec`:
one n_embd vector per layer, the same for every sequence of a context), and shows each tensor a
graph computes to an *eval callback* (`cb_eval`, fixed when a context is made); the residual
after block L is the tensor it names `l_out-L`, the control vector already added. So:

- **Steering**: what `Steering._at` says a forward on this thread adds at each attached block
  (the live state, or a request's own inside `steered`) is one control vector
  (`control_vector`), set on a context before a decode whenever it is not the one the context
  holds. Its key also marks the prompt a slot prefilled, so a prefix computed under other
  steering is never reused. A request's own steering decodes alone — the serial path does —
  with the vector swapped in for its steps and back for the batch's.
- **Readouts and monitors**: a context made with the eval callback (the engine's reading and
  scoring contexts; the generation context has none: a Python call per graph node, ~1,100 a
  SmolLM2 step, costs even when nothing is read) hands `l_out-L` of a block that an observer
  reads now to `tap`: `post_steering` is that tensor, `pre_steering` it less the delta the
  vector added there.
- llama.cpp's control vector has no layer 0 (its loader never makes one), so an SAE reading
  block 0's output cannot be steered and is refused.

torch is imported only here (the SAE arithmetic is steering.py's), so a GGUF actor pays for it
once an SAE is attached, not at every start.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np
import torch

from ..sae import SAE
from ..steering import CALIBRATION_TEXT, Hooked, Steering, feed, median_norm
from .llama_cpp_engine import residual_name


def unsteerable(sae: SAE) -> str | None:
    """Why llama.cpp cannot serve `sae` (the steering coordinator refuses it before recording
    it), or None."""
    if sae.block == 0:
        return (
            f"{sae.hook_name} reads block 0's output, which llama.cpp cannot steer "
            "(its control vectors start at layer 1)"
        )
    return None


class CvecSteering(Steering):
    """`engine`: a LlamaCppEngine — its model's width and layers, and `residuals` for the
    calibration pass."""

    engine = "llama.cpp"

    def __init__(self, engine, n_layers: int):
        torch.set_num_threads(1)  # one SAE row a step: llama.cpp's threads keep the cores
        self._engine = engine
        super().__init__(engine.model.n_embd(), n_layers, "cpu", torch.float32)
        self._by_name: dict[bytes, Hooked] = {}
        self._probe: tuple[bytes, Callable] | None = None  # the calibration pass's capture
        self._vector_for: tuple = (None, None, None)  # (changes, request, suppressed) `_vector` is for
        self._vector: tuple = (None, None)

    def _check(self, sae: SAE) -> None:
        why = unsteerable(sae)
        if why is not None:
            raise ValueError(why)

    def _install(self, entry: Hooked) -> None:
        self._by_name[residual_name(entry.info.block)] = entry

    def _remove(self, entry: Hooked) -> None:
        del self._by_name[residual_name(entry.info.block)]

    def _residual_norm(self, sae: SAE) -> float:
        seen: list[np.ndarray] = []
        self._probe = (residual_name(sae.block), seen.append)
        try:
            self._engine.residuals(self._engine.tokenize(CALIBRATION_TEXT))  # unsteered: the scoring context
        finally:
            self._probe = None
        return median_norm(torch.from_numpy(np.concatenate(seen)))

    # -- for the engine -------------------------------------------------------------------------

    def control_vector(self) -> tuple[bytes | None, tuple[np.ndarray, int, int] | None]:
        """The control vector a decode on this thread adds, as llama_set_adapter_cvec takes it
        (rows for layers 1 … il_end, il_start, il_end), and its key; (None, None) for none.
        Kept until steering changes, so a decode step pays one comparison."""
        request, suppressed = self._local.request, self._local.suppressed
        held = self._vector_for
        if held[0] == self.changes and held[1] is request and held[2] == suppressed:
            return self._vector
        rows = {}
        for entry in self._hooked.values():
            delta, _ = self._at(entry)
            if delta is not None:
                rows[entry.info.block] = delta.numpy()
        if rows:
            start, end = min(rows), max(rows)
            data = np.zeros((end, self._d_model), dtype=np.float32)
            for block, delta in rows.items():
                data[block - 1] = delta
            key = hashlib.blake2b(data.tobytes() + f"{start}".encode(), digest_size=16).digest()
            self._vector = (key, (data.reshape(-1), start, end))
        else:
            self._vector = (None, None)
        self._vector_for = (self.changes, request, suppressed)
        return self._vector

    def taps(self) -> dict[bytes, Callable[[np.ndarray], None]]:
        """What a forward on this thread reads: tensor name → who takes it ([positions, d_in]
        float32, the control vector added). Made once per decode, so the eval callback pays a
        name and a lookup per graph node."""
        if self._probe is not None:
            return dict([self._probe])
        if not self._local.observers:
            return {}
        taps = {}
        for name, entry in self._by_name.items():
            delta, observers = self._at(entry)
            if observers:
                taps[name] = functools.partial(_take, entry.sae, observers, delta)
        return taps


def _take(sae: SAE, observers: list, delta: torch.Tensor | None, rows: np.ndarray) -> None:
    post = torch.from_numpy(rows)[None]
    feed(observers, sae, post if delta is None else post - delta, post)
