"""The transformers engine: a Hugging Face causal LM on CPU (float32) or CUDA (bf16).

The decode loop is written out (prefill, then one forward per token with a
DynamicCache) rather than calling `generate`, so that every step is a point where
the caller can stop, and a sequence's cache lives exactly as long as its iterator.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from ..base import Constraint, ModelInfo, SamplingParams, default_cpu_threads
from ..capabilities import ENGINES
from ..reuse_budget import available_memory, reuse_bytes
from ..scoring import Echoed, Scored, prompt_tokens, score_row
from ..steering import CALIBRATION_TEXT, Monitor, Readout, Steering, feed, median_norm
from ..text.chat import ChatTemplate
from ..text.constraints import Constraints
from ..text.pooling import MEAN
from .fixed_shape import FixedShape
from .fixed_shape import supported as fixed_shape_supported
from .pooled_batches import embed_batched
from .prefix_cache import PrefixCache
from .sampling import new_generator, sample, token_logprob


class TransformersEngine:
    capabilities = ENGINES["transformers"]

    def __init__(
        self,
        model_id: str,
        path: str | Path,
        device: str = "cpu",
        dtype: str | None = None,
        threads: int | None = None,
        chat_template: str | None = None,
        prefix_cache_tokens: int | None = 0,
        fixed_shape: str = "auto",
        fixed_shape_slots: int = 64,
        fixed_shape_length: int = 2048,
    ):
        """`prefix_cache_tokens`: the KV tokens kept for prefix reuse (prefix_cache.py); 0: none;
        None: sized from memory (reuse_budget.reuse_bytes of what the device has available).
        `fixed_shape`: decode in fixed shapes (fixed_shape.py) — "auto" (on CUDA, compiled), "on"
        (here; compiled on CUDA only), "off" — in slots of `fixed_shape_length` tokens, a batch
        holding `fixed_shape_slots` sequences."""
        path = Path(path)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(threads or default_cpu_threads())
        torch_dtype = (
            getattr(torch, dtype) if dtype else (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        )
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if chat_template:  # the config's, over the checkpoint's own
            self.tokenizer.chat_template = chat_template
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        # transformers 5.2x renamed `past_key_values` to `cache`; the H200 image has 5.17.
        params = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        cfg = self.model.config
        self.vocab_size = cfg.vocab_size
        # the logits' rows past the tokenizer are padding, not tokens
        self.scoring_vocab = min(cfg.vocab_size, len(self.tokenizer))
        self.has_chat_template = bool(self.tokenizer.chat_template)
        self.chat = (
            ChatTemplate(
                lambda msgs, gen, tools, kwargs: self.tokenizer.apply_chat_template(
                    msgs, tools=tools, add_generation_prompt=gen, tokenize=False, **(kwargs or {})
                )
            )
            if self.has_chat_template
            else None
        )
        # a sliding-window layer drops its oldest keys by count, which left padding would skew and
        # a stored prefix's cache may already have dropped: neither batching nor prefix reuse there
        sliding = bool(getattr(cfg, "sliding_window", None)) or "sliding_attention" in (
            getattr(cfg, "layer_types", None) or ()
        )
        self.batchable = not sliding
        self.prefix_cache = None if prefix_cache_tokens == 0 or sliding else self._prefix_cache(prefix_cache_tokens)
        wanted = fixed_shape == "on" or fixed_shape == "auto" and self.device.type == "cuda"
        self.fixed_shape = wanted and not sliding and fixed_shape_supported(self.model)
        self.fixed_shape_slots, self.fixed_shape_length = fixed_shape_slots, fixed_shape_length
        self._serial_step: FixedShape | None = None  # one slot, for the serial path's sequence
        self._serial_step_busy = False
        self._batch_step: FixedShape | None = None
        # sequences a continuous batch holds at most (the scheduling policy's capacity): its slots
        self.parallel = fixed_shape_slots if self.fixed_shape else None
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) or self.tokenizer.eos_token_id
        self.eos_token_ids = frozenset(eos if isinstance(eos, list) else [eos]) - {None}
        # grammar compiler bound to this tokenizer (ms for the demo, ~1 s at a 128k vocabulary)
        self._constraints = Constraints(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.info = ModelInfo(
            id=model_id,
            engine="transformers",
            context_length=int(getattr(cfg, "max_position_embeddings", 0) or self.tokenizer.model_max_length),
            dtype=str(torch_dtype).removeprefix("torch."),
            device=str(self.device),
            parameters=sum(p.numel() for p in self.model.parameters()),
            revision=_revision(path),
            quantization=_quantization(cfg),
            # its weights and buffers; the caches grow per request (the prefix cache as it keeps prefixes)
            footprint_bytes=sum(t.nbytes for t in (*self.model.parameters(), *self.model.buffers())),
        )
        self.steering = BlockHooks(self)  # SAE hooks: steering, readouts, suppression (steering.py)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        generation_prompt: bool = True,
    ) -> list[int]:
        # A rendered template carries its own BOS: don't add special tokens again.
        text = self.chat.render(messages, tools, template_kwargs, generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def compile_constraint(self, spec: Constraint):
        """A grammar for the constraint (constraints.Constraints.compile); compiled grammars are cached."""
        return self._constraints.compile(spec)

    def matcher(self, grammar):
        """A fresh matcher of a compiled grammar, for one sequence."""
        return self._constraints.matcher(grammar)

    def generate_ids(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        matcher=None,
        readout: Readout | None = None,
        monitor: Monitor | None = None,
    ) -> Iterator[tuple[int, float, tuple]]:
        """With a `matcher`, every step is masked to what its grammar allows (the caller
        stops once the grammar is complete); with a `readout` (steering.readout) and/or a
        `monitor` (steering.monitor), every forward records its SAE activations — and the
        prompt is prefilled whole (no stored prefix: every position is read). With the
        fixed-shape path on, the steps after the prefill run there (fixed_shape.py) unless
        the sequence is observed or could outgrow a slot."""
        gen = new_generator(params.seed, self.device)
        # every token seen so far, for the repetition penalty (prompt included, as HF does)
        seen = torch.tensor(prompt_ids + [0] * (params.max_tokens or 0), device=self.device)
        n_seen = len(prompt_ids)
        observed = readout is not None or monitor is not None
        fixed = cache = None
        try:
            with torch.inference_mode():
                with self.steering.reading(readout, monitor):
                    logits, cache = self.prefill(prompt_ids, reuse=not observed)
                if not observed and params.max_tokens and n_seen + params.max_tokens <= self.fixed_shape_length:
                    fixed = self._take_serial_step()
                if fixed is not None:
                    fixed.load(0, cache)
                    cache = None
                while True:
                    if matcher is not None:
                        logits = logits.float()
                        matcher.mask(logits)
                    token = sample(logits, params, gen, seen[:n_seen])
                    if matcher is not None:
                        matcher.consume(token)
                    yield token, *token_logprob(logits, token, params.logprobs)
                    if n_seen < len(seen):
                        seen[n_seen] = token
                    n_seen += 1
                    if fixed is not None:
                        logits = fixed.step([token], [n_seen - 1])[0]
                        continue
                    with self.steering.reading(readout, monitor):
                        out = self.model(
                            input_ids=torch.tensor([[token]], device=self.device),
                            use_cache=True,
                            logits_to_keep=1,
                            **{self.cache_arg: cache},
                        )
                    logits = out.logits[0, -1]
                    del out
        finally:
            del cache  # the sequence's KV memory goes with its iterator
            if fixed is not None:
                self._serial_step_busy = False

    def prefill(self, prompt_ids: list[int], reuse: bool = True) -> tuple[torch.Tensor, DynamicCache]:
        """One sequence's prompt forward: the next-token logits and the cache. It starts from
        the longest stored prefix of the prompt computed under this thread's steering (unless
        not `reuse`), and stores the prompt's KV (prefix_cache.py)."""
        cache = DynamicCache()
        start, kv = (
            self.prefix_cache.lookup(self.steering.key(), prompt_ids) if reuse and self.prefix_cache else (0, None)
        )
        for layer, (keys, values) in enumerate(kv or ()):
            cache.update(keys, values, layer)  # a copy: the store's tensors are never written
        ids = torch.tensor([prompt_ids[start:]], device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
        if self.prefix_cache is not None:  # the new blocks' KV, copied into the tree
            self.prefix_cache.store(
                self.steering.key(), prompt_ids, [(layer.keys, layer.values) for layer in cache.layers]
            )
        return out.logits[0, -1], cache

    def _prefix_cache(self, tokens: int | None) -> PrefixCache:
        """The prefix store, bounded to `tokens` of KV, or (None) by the memory available now."""
        with torch.inference_mode():  # one token's KV, measured: whatever the attention's layout
            cache = DynamicCache()
            ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
            token_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
        if tokens is not None:
            bound = token_bytes * tokens
        else:
            bound = reuse_bytes(available_memory(str(self.device)), host=self.device.type != "cuda")
        return PrefixCache(bound, token_bytes)

    def _take_serial_step(self) -> FixedShape | None:
        """The one-slot fixed-shape step for a serial sequence, if the path is on and the step is
        free (a second sequence meanwhile, e.g. interleaved by an in-process caller, runs eagerly)."""
        if not self.fixed_shape or self._serial_step_busy:
            return None
        if self._serial_step is None:
            self._serial_step = FixedShape(self, 1, self.fixed_shape_length, self.device.type == "cuda")
        self._serial_step_busy = True
        return self._serial_step

    def batch_step(self) -> FixedShape:
        """The fixed-shape step of the continuous batch: `fixed_shape_slots` slots, made once
        (its KV buffers and compiled graphs outlive each batch)."""
        if self._batch_step is None:
            self._batch_step = FixedShape(
                self, self.fixed_shape_slots, self.fixed_shape_length, self.device.type == "cuda"
            )
        return self._batch_step

    def unembedding(self) -> torch.Tensor:
        """W_U [rows, d_model], the output projection: what a feature's logit effects go through
        (engines/dashboards.py)."""
        return self.model.get_output_embeddings().weight.detach()

    def new_batch(self, sampling: SamplingParams):
        """A continuous batch of sequences sampled under `sampling` (batching.py)."""
        from .batching import DecodeBatch

        return DecodeBatch(self, sampling)

    def score(
        self,
        prompt_ids: list[int],
        temperature: float,
        allowed: list[int] | None,
        report: int,
        readout: Readout | None = None,
    ) -> Scored:
        """With a `readout`, the pass records its SAE activations (unsteered, as the pass is)."""
        with torch.inference_mode(), self.steering.suppressed(), self.steering.reading(readout):  # never steered
            out = self.model(input_ids=torch.tensor([prompt_ids], device=self.device), logits_to_keep=1)
            row = _host_rows(out.logits[0, -1:])[0]
        return score_row(row, self.scoring_vocab, temperature, allowed, report)

    def prompt_logprobs(
        self,
        prompt_ids: list[int],
        temperature: float,
        report: int,
        allowed: list[int] | None = None,
        next_report: int | None = None,
        readout: Readout | None = None,
    ) -> Echoed:
        """The prompt in chunks of ECHO_CHUNK positions over one cache, unsteered: each chunk's
        logits (every position's) are reduced as they come, so a long prompt never holds the
        whole prompt's — the last row, the position after the prompt, is scored as `score` does."""
        tokens, last = [], None
        cache = DynamicCache()
        try:
            with torch.inference_mode(), self.steering.suppressed(), self.steering.reading(readout):
                for start in range(0, len(prompt_ids), ECHO_CHUNK):
                    part = prompt_ids[start : start + ECHO_CHUNK]
                    out = self.model(
                        input_ids=torch.tensor([part], device=self.device), use_cache=True, **{self.cache_arg: cache}
                    )
                    rows = _host_rows(out.logits[0])
                    del out
                    targets = prompt_ids[start + 1 : start + 1 + len(part)]
                    tokens += prompt_tokens(
                        rows[: len(targets)], targets, self.scoring_vocab, temperature, report, first=start + 1
                    )
                    last = rows[-1]
        finally:
            del cache
        scored = None if next_report is None else score_row(last, self.scoring_vocab, temperature, allowed, next_report)
        return Echoed(tokens, scored)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """The spec's rule: the mean of the last hidden layer over each input's tokens, in padded batches."""
        with torch.inference_mode(), self.steering.suppressed():  # embeddings are never steered
            return embed_batched(
                lambda ids, mask: self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state,
                inputs,
                MEAN,
                self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0,
                self.device,
            )

    def unload(self) -> None:
        del self.model
        # the stored prefixes and the fixed-shape slots are KV of this model: they go with it
        self.prefix_cache = self._serial_step = self._batch_step = None
        if self.device.type == "cuda":
            if self.fixed_shape:  # compiled graphs hold the weights (every model here recompiles once)
                torch._dynamo.reset()
            torch.cuda.empty_cache()


class BlockHooks(Steering):
    """Steering on a transformers model: each attached SAE owns a forward hook on the module its
    hook point reads — its decoder block (`model.model.layers[block]`) for the residual stream,
    the block's `self_attn` or `mlp` for attention or MLP out — which adds the forward's delta to
    the module's output and feeds the observers (steering.Steering._at says which)."""

    engine = "transformers"

    def __init__(self, engine: TransformersEngine):
        # the engine, not its layers: holding them would keep an unloaded model's weights alive
        self._engine = engine
        model = engine.model
        super().__init__(
            model.config.hidden_size, len(model.model.layers), engine.device, next(model.parameters()).dtype
        )

    def _module(self, sae):
        """The module whose output `sae`'s hook point is."""
        block = self._engine.model.model.layers[sae.block]
        if sae.residual:
            return block
        module = getattr(block, _SUBLAYERS[sae.site], None)
        if module is None:
            raise ValueError(f"SAE hook {sae.hook_name}: this model's blocks have no {_SUBLAYERS[sae.site]} module")
        return module

    def _check(self, sae) -> None:
        self._module(sae)
        # the fixed-shape step adds residual deltas from its buffer (Steering.deltas) and, compiled,
        # runs no hook a later attach adds: a sublayer's delta would be lost there
        if not sae.residual and self._engine.fixed_shape:
            raise ValueError(
                f"SAE hook {sae.hook_name} reads {sae.reads}: this model decodes in fixed shapes, which "
                'steer the residual stream only (fixed_shape = "off" serves attention and MLP out)'
            )

    def _install(self, entry) -> None:
        def hook(module, args, output):
            delta, observers = self._at(entry)
            if delta is None and not observers:
                return None
            # transformers 5.2x returns the hidden states; older releases (the H200 image's 5.17) a
            # tuple, as attention modules do (output, weights)
            hidden = output[0] if isinstance(output, tuple) else output
            steered = hidden if delta is None else hidden + delta
            feed(observers, entry.sae, hidden, steered)
            if delta is None:
                return None
            return (steered, *output[1:]) if isinstance(output, tuple) else steered

        entry.handle = self._module(entry.sae).register_forward_hook(hook)

    def _remove(self, entry) -> None:
        entry.handle.remove()

    def _residual_norm(self, sae) -> float:
        seen = []
        handle = self._module(sae).register_forward_hook(
            lambda module, args, output: seen.append(output[0] if isinstance(output, tuple) else output)
        )
        try:
            ids = self._engine.tokenize(CALIBRATION_TEXT)
            with self.suppressed(), torch.inference_mode():
                self._engine.model(input_ids=torch.tensor([ids], device=self._engine.device), logits_to_keep=1)
        finally:
            handle.remove()
        return median_norm(seen[0][0])


# the module of a decoder block whose output a sublayer hook point reads (Llama-family names)
_SUBLAYERS = {"attn_out": "self_attn", "mlp_out": "mlp"}


# prompt positions run (and reduced) at a time by prompt_logprobs: 256 × a 128k vocabulary is 128 MB of logits
ECHO_CHUNK = 256


def _host_rows(logits: torch.Tensor):
    """Logits rows as a float32 numpy array on the host (scoring.py reduces them in float64)."""
    return logits.float().cpu().numpy()


def _revision(path: Path) -> str | None:
    """A Hugging Face cache snapshot's commit, the demo generator's version and seed, or the
    GGUF file and converter version of a conversion; None (written "unrecorded") when the
    checkpoint does not say."""
    if path.parent.name == "snapshots":
        return path.name[:8]
    marker = path / "greenroom.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        if "converter_version" in meta:  # dequantised from a GGUF file (gguf_convert.py)
            return f"{Path(meta['gguf']).stem}-c{meta['converter_version']}"
        return f"demo-{meta.get('size')}-v{meta.get('generator_version')}-s{meta.get('seed')}"
    return None


_STORAGE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def _quantization(cfg) -> str | None:
    """The checkpoint's quantization method, or the dtype its weights are stored in."""
    quant = getattr(cfg, "quantization_config", None)
    if quant:
        return str(quant.get("quant_method") if isinstance(quant, dict) else quant.quant_method).upper()
    stored = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    return _STORAGE.get(str(stored).removeprefix("torch.")) if stored else None
