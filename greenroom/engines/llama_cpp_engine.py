"""The llama.cpp engine: one GGUF file through llama-cpp-python's bindings, on the CPU.

Like every engine it only turns prompt ids into token ids, one per step; stops,
detokenisation and finish reasons are generation.py's (`Decoder`). The high-level
`Llama` class decodes one sequence at a time, so the engine drives llama.cpp's
model, context and sampler chains itself. A context is not thread-safe: the engine
actor's single worker thread is its only caller.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import logging
import time
from pathlib import Path
from typing import Iterator

import jinja2
import jinja2.sandbox
import llama_cpp
import llama_cpp._internals as _internals
import numpy as np

from .base import GREEDY_BELOW, EngineError, ModelInfo, SamplingParams, default_cpu_threads
from .capabilities import ENGINES
from .chat import ChatTemplate
from .generation import Decoder, Delta
from .gguf_files import quant_label

log = logging.getLogger("greenroom.llama_cpp")

# ggml's levels (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5. llama-cpp-python
# 0.3.36 maps them wrongly and prints to the terminal; ours sends them to greenroom's log at
# debug (errors at warning: they explain a failed load).
_ERROR, _CONT = 4, 5
_last_level = 1


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data) -> None:
    global _last_level
    level = _last_level if level == _CONT else level
    _last_level = level
    message = text.decode("utf-8", errors="replace").rstrip("\n")
    if message:
        log.log(logging.WARNING if level == _ERROR else logging.DEBUG, "%s", message)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


class LlamaCppEngine:
    """One model, one generation context holding up to `parallel` sequences: every
    sequence — a serial request's or a batch's — takes a sequence slot of it, so requests
    decode together, one llama_decode per step for all of them (llama.cpp's own
    batching; each sequence samples with its own sampler chain)."""

    capabilities = ENGINES["llama.cpp"]
    batchable = True
    batches_any_sampling = True  # per-sequence samplers: no fixed sampling parameters needed

    def __init__(self, model_id: str, path: str | Path, n_ctx: int | None = None, threads: int | None = None,
                 parallel: int = 4, chat_template: str | None = None):
        self.path = Path(path)
        self.threads = threads or default_cpu_threads()
        # llama-cpp-python's verbose=False would dup2 the process's stdout/stderr away during
        # the load: our callback owns llama.cpp's logging.
        self.model = _internals.LlamaModel(path_model=str(self.path), params=llama_cpp.llama_model_default_params(),
                                           verbose=True)
        trained = self.model.n_ctx_train()
        self.n_ctx = min(n_ctx or trained, trained) if trained > 0 else (n_ctx or 4096)
        self.parallel = max(1, parallel)
        # every sequence may fill its whole window: the shared cache holds `parallel` of them
        self.ctx = self._context(self.n_ctx * self.parallel, min(self.n_ctx * self.parallel, 512), self.parallel)
        # a free slot keeps its last sequence's cache: a prompt sharing its prefix skips that much prefill
        self._cached: dict[int, list[int]] = {slot: [] for slot in range(self.parallel)}  # free slots
        self._live: dict[int, _Sequence] = {}  # busy slots
        self._embedder: _internals.LlamaContext | None = None  # an embeddings context, made on first use
        meta = self.model.metadata()
        self.vocab_size = self.scoring_vocab = self.model.n_vocab()
        self._bos = _token_text(self.model, meta.get("tokenizer.ggml.bos_token_id"))
        self._eos = _token_text(self.model, meta.get("tokenizer.ggml.eos_token_id"))
        # llama.cpp's own end-of-generation set: eos, eot and eom, and the tokens its vocabulary
        # loader marks by their text (Gemma's <end_of_turn>, <|endoftext|>, FIM's <reponame>, …)
        is_eog = llama_cpp.llama_vocab_is_eog
        self.eos_token_ids = frozenset(t for t in range(self.vocab_size) if is_eog(self.model.vocab, t))
        source = chat_template or meta.get("tokenizer.chat_template")  # the config's, over the file's
        template = _environment().from_string(source) if source else None
        self.has_chat_template = template is not None
        # the file's template takes no variables: chat_template_kwargs are reported, never passed
        self.chat = ChatTemplate(lambda msgs, gen, tools, _kwargs: template.render(
            messages=msgs, tools=tools, add_generation_prompt=gen, bos_token=self._bos, eos_token=self._eos)) \
            if template is not None else None
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "true") != "false"
        quant = quant_label(self.path)
        self.info = ModelInfo(id=model_id, engine="llama.cpp", context_length=self.n_ctx, dtype=quant, device="cpu",
                              parameters=self.model.n_params(), revision=meta.get("general.name"),
                              quantization=quant)
        self.decode_together = self._together_is_faster()

    def _together_is_faster(self) -> bool:
        """Whether one llama_decode for all sequences beats one per sequence, measured here at
        load (a few steps of `parallel` one-token sequences). Where decoding is bound by
        memory traffic (a GPU, a big model) a batch costs about what one sequence does; on a
        CPU core that computes flat out it costs more than the sequences one by one (100m
        demo, 1 thread: 4 sequences together 126 tok/s, alone 146) — so the sequences then
        take turns, one step each, which keeps the fairness of batching without its cost."""
        n = min(self.parallel, 4)
        if n < 2:
            return False
        greedy = SamplingParams(max_tokens=1, temperature=0)
        seqs = [self._open([max(self.model.token_bos(), 0)], greedy) for _ in range(n)]
        try:
            self._decode(seqs)  # warm: buffers sized for n rows
            start = time.perf_counter()
            for _ in range(3):
                self._decode(seqs)
            together = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(3):
                for seq in seqs:
                    self._decode([seq])
            apart = time.perf_counter() - start
        finally:
            for seq in seqs:
                self._close(seq)
            for slot in self._cached:  # the probe's tokens are no prefix worth keeping
                llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot, -1, -1)
                self._cached[slot] = []
        log.debug("llama.cpp decode, %d sequences: together %.1f ms, one by one %.1f ms", n,
                  together * 1e3 / 3, apart * 1e3 / 3)
        return together < apart

    def _context(self, n_ctx: int, n_batch: int, n_seq: int, embeddings: bool = False) -> _internals.LlamaContext:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True  # one cache the sequences share, as they grow unevenly
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # "auto" picked it on CPU: slower here
        if embeddings:
            params.embeddings, params.pooling_type = True, llama_cpp.LLAMA_POOLING_TYPE_MEAN
        return _internals.LlamaContext(model=self.model, params=params, verbose=True)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # as transformers does: special tokens written in the text are parsed as such
        return self.model.tokenize(text.encode("utf-8"), add_bos=add_special_tokens and self._add_bos, special=True)

    def render_chat(self, messages: list[dict], template_kwargs: dict | None = None,
                    tools: list[dict] | None = None) -> list[int]:
        """The file's own template (or the config's); `template_kwargs` never reach it (the
        ledger reports them). The rendered text carries the template's own BOS."""
        return self.tokenize(self.chat.render(messages, tools), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.model.detokenize(ids).decode("utf-8", errors="replace")

    def generate_ids(self, prompt_ids: list[int], params: SamplingParams,
                     matcher=None) -> Iterator[tuple[int, float]]:
        """The serial path: one sequence slot of the shared context, decoded alone."""
        if matcher is not None:  # the ledger refuses response_format and tools before this
            raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                              "response_format")
        seq = self._open(prompt_ids, params)
        try:
            while True:
                yield seq.next_id, seq.logprob
                self._decode([seq])
                seq.sample(self, 0)
        finally:
            self._close(seq)

    def new_batch(self, sampling: SamplingParams) -> "LlamaCppBatch":
        """Sequences decoded together; each keeps its own sampling parameters."""
        return LlamaCppBatch(self)

    # sequences ---------------------------------------------------------------------
    def _open(self, prompt_ids: list[int], params: SamplingParams) -> "_Sequence":
        """Take a free slot, reusing the longest cached prefix of the prompt — a free slot's
        last sequence, or any slot's, copied (the cache shares the cells) — prefill the rest
        (in n_batch chunks; at least the last token, whose logits give the first sample) and
        sample the first token."""
        if not self._cached:
            raise EngineError("queue_full", f"all {self.parallel} sequence slots of the model are in use")
        known = {**{slot: seq.tokens for slot, seq in self._live.items()}, **self._cached}
        source, reused = max(((slot, _common_prefix(tokens, prompt_ids)) for slot, tokens in known.items()),
                             key=lambda pair: (pair[1], pair[0] in self._cached))
        slot = source if source in self._cached else max(self._cached, key=lambda s: len(self._cached[s]) == 0)
        del self._cached[slot]
        reused = min(reused, len(prompt_ids) - 1)
        memory = self.ctx.memory
        if slot != source:
            llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)
            llama_cpp.llama_memory_seq_cp(memory, source, slot, 0, reused)
        elif not llama_cpp.llama_memory_seq_rm(memory, slot, reused, -1):
            llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)  # this cache cannot be cut
            reused = 0
        seq = _Sequence(slot, _sampler(self.vocab_size, self.n_ctx, params, prompt_ids))
        seq.tokens = prompt_ids[:reused]
        self._live[slot] = seq
        try:
            chunk = self.ctx.params.n_batch
            for start in range(reused, len(prompt_ids), chunk):
                part = prompt_ids[start:start + chunk]
                batch = _internals.LlamaBatch(n_tokens=len(part), embd=0, n_seq_max=1, verbose=False)
                for i, token in enumerate(part):
                    _put(batch, i, token, start + i, seq.slot, start + i == len(prompt_ids) - 1)
                batch.batch.n_tokens = len(part)
                self._run(batch)
                seq.tokens += part
            seq.length = len(prompt_ids)
            seq.sample(self, len(part) - 1)
        except BaseException:
            seq.tokens = []  # what reached the cache is unknown
            self._close(seq)
            raise
        return seq

    def _decode(self, seqs: list["_Sequence"]) -> None:
        """One step: each sequence's last sampled token, at its next position."""
        batch = _internals.LlamaBatch(n_tokens=len(seqs), embd=0, n_seq_max=1, verbose=False)
        for i, seq in enumerate(seqs):
            _put(batch, i, seq.next_id, seq.length, seq.slot, True)
            seq.length += 1
            seq.tokens.append(seq.next_id)
        batch.batch.n_tokens = len(seqs)
        self._run(batch)

    def _run(self, batch) -> None:
        code = llama_cpp.llama_decode(self.ctx.ctx, batch.batch)
        if code != 0:
            raise EngineError("generation_failed", f"llama_decode failed (code {code})")

    def _close(self, seq: "_Sequence") -> None:
        """Free the slot, keeping its cache for a prompt that shares its prefix."""
        if not seq.tokens:
            llama_cpp.llama_memory_seq_rm(self.ctx.memory, seq.slot, -1, -1)
        llama_cpp.llama_sampler_free(seq.sampler)
        del self._live[seq.slot]
        self._cached[seq.slot] = seq.tokens

    def logprob(self, idx: int, token: int) -> float:
        """The model's log-probability of `token` at temperature 1, from batch row `idx`."""
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx.ctx, idx), shape=(self.vocab_size,))
        top = float(row.max())
        return float(row[token] - top - np.log(np.exp(row - top, dtype=np.float64).sum()))

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Mean-pooled final hidden states (after the output norm), one per input, from a
        second context in embeddings mode (the weights are shared)."""
        if self._embedder is None:
            self._embedder = self._context(self.n_ctx, self.n_ctx, 1, embeddings=True)
        width, out = self.model.n_embd(), []
        for ids in inputs:
            llama_cpp.llama_memory_clear(self._embedder.memory, True)
            batch = _internals.LlamaBatch(n_tokens=len(ids), embd=0, n_seq_max=1, verbose=False)
            batch.add_sequence(ids, 0, True)
            code = llama_cpp.llama_decode(self._embedder.ctx, batch.batch)
            if code != 0:
                raise EngineError("generation_failed", f"llama_decode failed (code {code})")
            out.append(llama_cpp.llama_get_embeddings_seq(self._embedder.ctx, 0)[:width])
        return out

    def score(self, prompt_ids, temperature, allowed, report, readout=None):
        raise EngineError("field_not_honoured", "scoring is not available on llama.cpp", "logprobs")

    def compile_constraint(self, spec: dict):
        raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                          "response_format")

    def matcher(self, grammar):
        raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                          "response_format")

    def unload(self) -> None:
        for ctx in (self._embedder, self.ctx):
            if ctx is not None:
                ctx.close()
        self.model.close()


class _Sequence:
    """One sequence in a slot of the context: where it is, and its sampled next token."""

    def __init__(self, slot: int, sampler):
        self.slot, self.sampler = slot, sampler
        self.length = 0  # tokens in the cache: the next one's position
        self.tokens: list[int] = []  # the tokens in the cache, in order
        self.next_id, self.logprob = -1, 0.0

    def sample(self, engine: LlamaCppEngine, idx: int) -> None:
        self.next_id = llama_cpp.llama_sampler_sample(self.sampler, engine.ctx.ctx, idx)  # also accepts it
        self.logprob = engine.logprob(idx, self.next_id)


class LlamaCppBatch:
    """The continuous batch (the engine actor's interface, as batching.DecodeBatch): sequences
    join at step boundaries, prefilled on their own, and leave when they finish."""

    def __init__(self, engine: LlamaCppEngine):
        self._engine = engine
        self._seqs: dict[object, tuple[_Sequence, Decoder]] = {}

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def keys(self) -> list:
        return list(self._seqs)

    def join(self, joining: list[tuple[object, list[int], SamplingParams]]) -> list[Delta]:
        return [self._join(*row) for row in joining]

    def _join(self, key, prompt_ids: list[int], params: SamplingParams) -> Delta:
        decoder = Decoder(self._engine, params)
        done = decoder.empty()
        if done is not None:
            return done
        seq = self._engine._open(prompt_ids, params)
        delta = decoder.feed(seq.next_id, seq.logprob)
        if delta.finish_reason is None:
            self._seqs[key] = (seq, decoder)
        else:
            self._engine._close(seq)
        return delta

    def step(self) -> list[tuple[object, Delta]]:
        """One token for every sequence: one llama_decode for all, or one each where that
        measured faster (LlamaCppEngine._together_is_faster)."""
        engine, rows = self._engine, list(self._seqs.items())
        if engine.decode_together:
            engine._decode([seq for _, (seq, _) in rows])
            for i, (_, (seq, _)) in enumerate(rows):
                seq.sample(engine, i)
        else:
            for _, (seq, _) in rows:
                engine._decode([seq])
                seq.sample(engine, 0)
        out = [(key, decoder.feed(seq.next_id, seq.logprob)) for key, (seq, decoder) in rows]
        self.leave([key for key, delta in out if delta.finish_reason])
        return out

    def leave(self, keys) -> None:
        for key in keys:
            seq, _ = self._seqs.pop(key, (None, None))
            if seq is not None:
                self._engine._close(seq)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _put(batch, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
    b = batch.batch
    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
    b.seq_id[i][0] = seq_id


def _sampler(n_vocab: int, window: int, params: SamplingParams, prompt_ids: list[int]):
    """The sequence's sampler chain, in the order our transformers sampling applies them
    (sampling.py): repetition penalty over everything seen, top-k, temperature, top-p."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731
    if params.repetition_penalty != 1.0:
        add(llama_cpp.llama_sampler_init_penalties(n_vocab, window, params.repetition_penalty, 0.0, 0.0))
        for token in prompt_ids:  # as HF's penalty counts the prompt
            llama_cpp.llama_sampler_accept(chain, token)
    if params.temperature < GREEDY_BELOW or params.top_k == 1:
        add(llama_cpp.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(llama_cpp.llama_sampler_init_top_k(params.top_k))
    add(llama_cpp.llama_sampler_init_temp(params.temperature))
    if params.top_p < 1.0:
        add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    add(llama_cpp.llama_sampler_init_dist(llama_cpp.LLAMA_DEFAULT_SEED))
    return chain


def _token_text(model: _internals.LlamaModel, token_id) -> str:
    return "" if token_id is None else model.detokenize([int(token_id)], special=True).decode("utf-8", errors="replace")


def _environment() -> jinja2.Environment:
    """The sandbox chat templates run in, with the helpers Hugging Face templates expect."""

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env
