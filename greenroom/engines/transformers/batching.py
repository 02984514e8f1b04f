"""Continuous batching at the decode-step level, for the transformers engine.

Measured before writing it (bench/batching.py, greedy, 2-core CPU): transformers' own
manager (`generate_batch`) decoded 64 sequences of the tiny demo at 3,858 tok/s against
19,371 for a static batch (this batch: 17,158), and 16 of 100m at 149 against 195 (this
batch: 198); on the H200, 745 against 5,200 at 64 (DESIGN.md). Its paged scheduler's
per-step Python costs most where a step is short, so the batch is held here: the running
sequences share one left-padded DynamicCache, one forward per step decodes them all, and
sequences join (prefilled together, then merged) and leave at step boundaries. Each
sequence keeps its own `Decoder` (detokeniser, stop matcher, finish reasons), the one the
serial path uses.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..base import SamplingParams
from ..generation import Decoder, Delta
from .sampling import new_generator, sample_rows


@attrs.define(eq=False)
class _Seq:
    key: object
    decoder: Decoder
    length: int  # real tokens in the cache: the next position id
    next_id: int  # sampled, fed at the next step


class DecodeBatch:
    """Sequences decoding together under one set of sampling parameters (`sampling`:
    temperature, top_p, top_k; no penalty, no seed — the batch draws from one
    generator). Where their KV lives is the engine's choice: a left-padded DynamicCache
    (`_PaddedRows`), or the fixed-shape step's slots when that path is on (`_SlotRows`);
    either way each row computes what it would alone."""

    prefills_together = True

    def __init__(self, engine, sampling: SamplingParams):
        self._engine = engine
        self.sampling = sampling
        self._gen = new_generator(None, engine.device)
        self._seqs: list[_Seq] = []
        self._rows = _SlotRows(engine) if engine.fixed_shape else _PaddedRows(engine)

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def keys(self) -> list:
        return [s.key for s in self._seqs]

    def join(self, joining: list[tuple[object, list[int], SamplingParams]]) -> list[Delta]:
        """Prefill these (key, prompt ids, params) and sample each one's first token; each
        joins the batch unless that token already finished it. The params give max_tokens
        and stop. Returns each one's first Delta."""
        decoders = [Decoder(self._engine, params) for _, _, params in joining]
        out = [decoder.empty() for decoder in decoders]
        todo = [i for i, delta in enumerate(out) if delta is None]
        if not todo:
            return out
        prompts = [joining[i][1] for i in todo]
        with torch.inference_mode():
            logits, prefilled = self._rows.prefill(prompts)
            tokens, logprobs = self._sample(logits)
        seqs = []
        for i, prompt, token, logprob in zip(todo, prompts, tokens, logprobs):
            out[i] = decoders[i].feed(token, logprob)
            seqs.append(_Seq(joining[i][0], decoders[i], len(prompt), token))
        self._rows.admit(prefilled)  # built before anything of the batch's changed: a failure leaves it whole
        self._seqs.extend(seqs)
        self.leave({seq.key for seq, i in zip(seqs, todo) if out[i].finish_reason})
        return out

    def step(self) -> list[tuple[object, Delta]]:
        """One forward for every sequence; the ones that finish leave the batch."""
        with torch.inference_mode():
            logits = self._rows.step([s.next_id for s in self._seqs], [s.length for s in self._seqs])
            tokens, logprobs = self._sample(logits)
        out, finished = [], set()
        for seq, token, logprob in zip(self._seqs, tokens, logprobs):
            seq.length, seq.next_id = seq.length + 1, token
            delta = seq.decoder.feed(token, logprob)
            out.append((seq.key, delta))
            if delta.finish_reason:
                finished.add(seq.key)
        self.leave(finished)
        return out

    def leave(self, keys) -> None:
        """Drop these sequences (finished, cancelled, failed) and their KV."""
        keep = [i for i, s in enumerate(self._seqs) if s.key not in keys]
        if len(keep) == len(self._seqs):
            return
        self._seqs = [self._seqs[i] for i in keep]
        self._rows.keep(keep)

    def _sample(self, logits: torch.Tensor) -> tuple[list[int], list[float]]:
        tokens = sample_rows(logits, self.sampling, self._gen)
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens.tolist(), logprobs.tolist()


class _PaddedRows:
    """The running sequences' KV as one DynamicCache whose row i is sequence i, left-padded to
    the longest: the attention mask hides the padding and position ids count real tokens only.
    Joiners are prefilled together (one left-padded forward) and concatenated (pad, cat); a
    leave selects the remaining rows and drops the columns that are padding in all of them."""

    def __init__(self, engine):
        self._engine = engine
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # [rows, cache length], 0 = padding
        self._padded = False  # without padding the model needs no mask (building one costs ~6 % per step)

    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, tuple]:
        device = self._engine.device
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        cache = DynamicCache()
        logits = self._forward(ids, cache, mask, (mask.cumsum(-1) - 1).clamp(min=0))
        return logits, (cache, mask)

    def admit(self, prefilled: tuple) -> None:
        cache, mask = prefilled
        if self._cache is None:
            self._cache, self._mask = cache, mask
        else:  # every tensor built before any is replaced: a failure (out of memory) leaves the batch whole
            width = max(self._mask.shape[1], mask.shape[1])
            merged = [
                (
                    torch.cat([_pad_kv(mine.keys, width), _pad_kv(theirs.keys, width)]),
                    torch.cat([_pad_kv(mine.values, width), _pad_kv(theirs.values, width)]),
                )
                for mine, theirs in zip(self._cache.layers, cache.layers)
            ]
            self._mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for m in (self._mask, mask)])
            for layer, (keys, values) in zip(self._cache.layers, merged):
                layer.keys, layer.values = keys, values
        self._padded = not bool(self._mask.all())

    def step(self, next_ids: list[int], lengths: list[int]) -> torch.Tensor:
        device = self._engine.device
        self._mask = F.pad(self._mask, (0, 1), value=1)
        return self._forward(
            torch.tensor([[i] for i in next_ids], device=device),
            self._cache,
            self._mask if self._padded else None,
            torch.tensor([[n] for n in lengths], device=device),
        )

    def keep(self, rows: list[int]) -> None:
        if not rows:
            self._cache = self._mask = None
            return
        index = torch.tensor(rows, device=self._engine.device)
        mask = self._mask[index]
        start = int(mask.any(dim=0).int().argmax())  # the first column some row uses
        self._mask = mask[:, start:]
        self._padded = not bool(self._mask.all())
        for layer in self._cache.layers:
            layer.keys, layer.values = layer.keys[index, :, start:], layer.values[index, :, start:]

    def _forward(self, ids, cache, mask=None, positions=None) -> torch.Tensor:
        out = self._engine.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._engine.cache_arg: cache},
        )
        return out.logits[:, -1]


class _SlotRows:
    """The running sequences' KV in the engine's fixed-shape step (fixed_shape.py): sequence i
    holds slot `slots[i]`. Joiners are prefilled one by one on the eager path (reusing stored
    prefixes, as the serial path does) and copied into free slots; a step runs every slot."""

    def __init__(self, engine):
        self._engine = engine
        self._fixed = engine.batch_step()
        self.slots: list[int] = []

    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, list]:
        done = [self._engine.prefill(prompt) for prompt in prompts]
        return torch.stack([logits for logits, _ in done]), [cache for _, cache in done]

    def admit(self, prefilled: list) -> None:
        free = sorted(set(range(self._fixed.slots)) - set(self.slots))
        if len(prefilled) > len(free):
            raise RuntimeError(f"the batch's {self._fixed.slots} slots are taken")
        for slot, cache in zip(free, prefilled):
            self._fixed.load(slot, cache)
        self.slots += free[: len(prefilled)]

    def step(self, next_ids: list[int], lengths: list[int]) -> torch.Tensor:
        ids, positions = [0] * self._fixed.slots, [0] * self._fixed.slots
        for slot, i, n in zip(self.slots, next_ids, lengths):
            ids[slot], positions[slot] = i, n
        return self._fixed.step(ids, positions)[torch.tensor(self.slots, device=self._engine.device)]

    def keep(self, rows: list[int]) -> None:
        self.slots = [self.slots[i] for i in rows]


def _pad_kv(t: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, heads, length, dim] left-padded with zeros to `width` positions."""
    return F.pad(t, (0, 0, width - t.shape[-2], 0))
