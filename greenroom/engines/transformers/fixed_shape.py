"""The fixed-shape decode step (transformers, Llama-family decoders): `slots` sequences of up to
`length` tokens each, decoded one token per slot per step in shapes that never change, so the
step can be compiled once (torch.compile with CUDA graphs on a card).

- **KV**: preallocated per layer, [slots, kv heads, length, head dim]; a step writes each slot's
  new key and value in place at that slot's position (`SlotCache.update`) and attends over all
  `length` columns under a mask hiding those past it. A sequence's prompt is prefilled on the
  eager path (prefix reuse included) and its KV copied into its slot (`load`).
- **Steering**: the step calls each decoder block's `forward` itself — the SAE hooks on the
  blocks (BlockHooks) do not run — and adds `steer[block, slot]` to every block's output, a
  buffer whose contents follow the steering (refilled from `Steering.deltas()` when
  `Steering.key()` changes) but whose shape and identity never do: the compiled graph is the
  same steered or not. Readouts and monitors read through the hooks, so a request with either
  decodes on the eager path.
- **Models**: the decoders whose model body is Llama's (embed, rotary, blocks, norm, head:
  FIXED_SHAPE_MODELS), with sdpa or eager attention (the additive mask), never sliding-window.
"""

from __future__ import annotations

import torch

FIXED_SHAPE_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def supported(model) -> bool:
    cfg = model.config
    return cfg.model_type in FIXED_SHAPE_MODELS and cfg._attn_implementation in ("sdpa", "eager")


class SlotCache:
    """The preallocated KV, as the attention layers see a cache: `update` writes this step's
    key and value of each slot at `at[slot]` and returns the whole buffers."""

    def __init__(self, cfg, slots: int, length: int, device, dtype, at: torch.Tensor):
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (slots, cfg.num_key_value_heads, length, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.at = at
        self._rows = torch.arange(slots, device=device)

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer: int, *args, **kwargs):
        self.keys[layer][self._rows, :, self.at] = keys[:, :, 0]
        self.values[layer][self._rows, :, self.at] = values[:, :, 0]
        return self.keys[layer], self.values[layer]


class FixedShape:
    """`slots` sequences decoded together in fixed shapes; the caller assigns slots, `load`s a
    prefilled sequence into one and calls `step` with every slot's next token and position
    (a free slot's are ignored: its row is computed and never read)."""

    def __init__(self, engine, slots: int, length: int, compiled: bool):
        model = engine.model
        cfg = model.config
        device, dtype = engine.device, next(model.parameters()).dtype
        self.slots, self.length = slots, length
        self._model, self._steering, self._cache_arg = model, engine.steering, engine.cache_arg
        self._ids = torch.zeros(slots, 1, dtype=torch.long, device=device)
        self._at = torch.zeros(slots, dtype=torch.long, device=device)
        self.cache = SlotCache(cfg, slots, length, device, dtype, self._at)
        self._steer = torch.zeros(cfg.num_hidden_layers, slots, 1, cfg.hidden_size, device=device, dtype=dtype)
        self._steer_key = None
        self._columns = torch.arange(length, device=device)
        self._hidden = torch.tensor(torch.finfo(dtype).min, device=device, dtype=dtype)
        if compiled:  # the buffers written in place stay where they are: CUDA graphs replay over them
            for t in (*self.cache.keys, *self.cache.values, self._steer, self._ids, self._at):
                torch._dynamo.mark_static_address(t)
        self._compiled = compiled
        self._run = torch.compile(self._forward, mode="reduce-overhead", fullgraph=True) if compiled else self._forward

    def load(self, slot: int, cache) -> None:
        """Copy a prefilled sequence's KV (a DynamicCache of one row) into `slot`."""
        for layer, (keys, values) in enumerate((layer.keys, layer.values) for layer in cache.layers):
            n = keys.shape[-2]
            self.cache.keys[layer][slot, :, :n] = keys[0]
            self.cache.values[layer][slot, :, :n] = values[0]

    def step(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        """One forward of every slot: slot i is fed ids[i] at positions[i]; the next-token logits, [slots, vocab]."""
        key = self._steering.key()
        if key != self._steer_key:  # the steering changed: every slot's vector follows (this thread's view)
            self._steer.zero_()
            for block, delta in self._steering.deltas().items():
                self._steer[block] = delta
            self._steer_key = key
        self._ids.copy_(torch.tensor(ids)[:, None])
        self._at.copy_(torch.tensor(positions))
        if not self._compiled:
            return self._run()
        # a new replay; its output lives in the graph's memory, which the next replay reuses
        torch.compiler.cudagraph_mark_step_begin()
        return self._run().clone()

    def _forward(self) -> torch.Tensor:
        body = self._model.model
        positions = self._at[:, None]
        hidden = body.embed_tokens(self._ids)
        rotary = body.rotary_emb(hidden, position_ids=positions)
        mask = torch.where(self._columns[None, :] <= positions, 0.0, self._hidden).to(hidden.dtype)[:, None, None, :]
        for i, block in enumerate(body.layers):
            out = block.forward(  # not block(...): the SAE hooks are the buffer's add below
                hidden,
                attention_mask=mask,
                position_ids=positions,
                position_embeddings=rotary,
                use_cache=True,
                **{self._cache_arg: self.cache},
            )
            hidden = (out[0] if isinstance(out, tuple) else out) + self._steer[i]
        return self._model.lm_head(body.norm(hidden))[:, -1]
