"""The llama.cpp engine: one GGUF file through llama-cpp-python's bindings, on the CPU.

Like every engine it only turns prompt ids into token ids, one per step; stops,
detokenisation and finish reasons are generation.py's (`Decoder`). The high-level
`Llama` class decodes one sequence at a time, so the engine drives llama.cpp's
model, context and sampler chains itself. A context is not thread-safe: the engine
actor's single worker thread is its only caller.

Reproducibility: a request's tokens are a function of its own prompt, sampling parameters
and seed — never of the traffic before or beside it — because each of its positions is computed
the same way every time. Measured on this build (bit-identical logits):
- with one KV cache the sequences shared (`kv_unified`) a sequence's cells landed wherever
  earlier requests had left room, and its greedy text changed after unrelated requests; so each
  sequence slot has a KV stream of its own, and a slot reuses only prompt tokens its own stream
  prefilled (never a generated token's cells: a decoded position's cells differ from the same
  position prefilled; never cells copied from another slot). The sliding-window layers' cache
  (Gemma 3) is full-size, llama.cpp's default: no cell of a sequence is dropped and reused.
- ggml's kernels compute a position differently with other rows beside it in its ubatch: on
  Gemma 3 270M Q4_K_M a 15-token prompt's last logits moved by up to 0.9 with its prefill split
  at 11 of its 14 points (the matrix kernels choose their tiles by the ubatch's row count), where
  SmolLM2's Q4_1 differed only for a position computed alone, and flash attention computes
  fewer than 64 queries otherwise than more. So a prompt is prefilled in the cells of a fixed
  grid — [128k, 128(k+1)), `_chunks` — whatever a slot had cached, and a slot reuses only whole
  cells (`_reusable`): a position is computed among the same rows every time. A grid of 128
  costs ~3 % of Gemma's prefill speed against 512-token ubatches (64: 11 %), none of SmolLM2's.
- weights repacked for the CPU (Q4_K, Q6_K, Q4_0 … on x86) compute a group of 4 rows — a decode
  step of 4 sequences — otherwise than fewer, and 10 of 24 greedy Gemma sequences changed when 3
  others decoded beside them; the weights are loaded as the file holds them, ~8 % of Gemma's
  decode speed (none of SmolLM2's: Q4_1 has no repacked kernel). With the grid and no repacking,
  24 of 24 greedy Gemma sequences (some past 256 cells, beside shorter ones) and 16 of 16 SmolLM2
  ones were the same, bit for bit, alone and beside up to 3 others, with either attention kernel.
A stream per slot costs ~8 % of 4-sequence decode throughput (SmolLM2, one thread), and
concurrent prompts sharing a prefix each prefill it.

Prompts kept in host RAM (prompt_store.py, as llama-server's --cache-ram): a prompt a free slot is
about to drop (another prompt takes the slot and keeps less of it) is cut to its whole grid cells
and copied out (llama_state_seq_get_data: its positions and f16 K/V rows); a later prompt whose
longest stored prefix beats every free slot's has it copied back into the slot holding least
(llama_state_seq_set_data), cut to that prefix, and prefills the rest in the grid's cells. What is
copied back is the bytes the prefill wrote, placed as a prefill places them — llama.cpp empties the
slot's stream and fills it from its first cell, where a prefill into an empty stream puts them —
and only prompt cells prefilled under the same control-vector key are stored, so every later
position is computed over the same cells among the same rows: measured, the tokens and
log-probabilities of a fresh engine without the store, bit for bit, on the demo Q8_0 and SmolLM2
Q4_1, alone and beside a decoding sequence (tests/live/test_gguf_prompt_store.py), and on Gemma 3
270M Q4_K_M (its sliding-window layers' cache is copied too; that test's prompts, once, in process).

Steering (llama_steering.py): the deltas are a control vector per context, set before a decode
when it differs from the one the context holds; a slot's prefilled prompt is kept with the key
of the vector it was prefilled under and reused only under the same one. Readouts and monitors
read `l_out-L` through llama.cpp's eval callback, which only the reading and scoring contexts
are made with.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import jinja2
import jinja2.sandbox
import llama_cpp
import llama_cpp._ctypes_extensions as _ctypes_ext
import llama_cpp._internals as _internals
import numpy as np

from .. import reuse_budget
from ..base import GREEDY_BELOW, Constraint, EngineError, ModelInfo, SamplingParams, default_cpu_threads
from ..capabilities import ENGINES
from ..generation import Decoder, Delta
from ..scoring import Echoed, Scored, prompt_tokens, score_row
from ..text.chat import ChatTemplate
from ..text.constraints import Constraints
from ..text.tool_calls import HERMES
from . import gguf_meta
from .bert_gguf import NORMALIZE_KEY
from .gguf_files import quant_label, revision
from .prompt_store import PREFILL_GRID, PromptStore, State

log = logging.getLogger("greenroom.llama_cpp")
PROBE_CELLS = 64  # per sequence, in the contexts `_decode_plan` measures decoding in
PROBE_PROMPT = 8  # tokens per sequence there before the measured steps (a prefill is ~8 ms a token)
EMBED_SEQUENCES = 64  # inputs pooled in one decode at most (and gguf_meta.embed_tokens tokens)

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

# ggml's tensor accessors, for the eval callback (the bindings wrap none of them)
_ggml = _ctypes_ext.load_shared_library("ggml-base", Path(llama_cpp.__file__).parent / "lib")
_ggml.ggml_get_name.argtypes, _ggml.ggml_get_name.restype = [ctypes.c_void_p], ctypes.c_char_p
_ggml.ggml_nelements.argtypes, _ggml.ggml_nelements.restype = [ctypes.c_void_p], ctypes.c_int64
_ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
_ggml.ggml_backend_tensor_get.restype = None


class LlamaCppEngine:
    """One model, one generation context holding up to `parallel` sequences: every
    sequence — a serial request's or a batch's — takes a sequence slot of it (a KV stream of
    its own), so requests decode together, one llama_decode per step for all of them
    (llama.cpp's own batching; each sequence samples with its own sampler chain, seeded by
    its request, and may be constrained by a grammar: constraints.py, as on transformers)."""

    capabilities = ENGINES["llama.cpp"]
    batchable = True
    batches_any_sampling = True  # per-sequence samplers: no fixed sampling parameters needed

    def __init__(
        self,
        model_id: str,
        path: str | Path,
        n_ctx: int | None = None,
        threads: int | None = None,
        parallel: int = 4,
        chat_template: str | None = None,
        cache_ram: int | None = None,
    ):
        """`n_ctx`: each sequence's window (None: from memory, gguf_meta.default_window; 0: the
        model's trained one); `cache_ram`: bytes of prompt states kept in host RAM
        (prompt_store.py; None: from memory, reuse_budget.reuse_bytes; 0: none)."""
        self.path = Path(path)
        self.threads = threads or default_cpu_threads()
        # an embedding decode is batch compute (hundreds of rows) that the front end only waits
        # for: unless `threads` is set, it runs on every core this process may use, as
        # llama-server computes by default (its -t: every physical core)
        self.embed_threads = threads or len(os.sched_getaffinity(0))
        # llama-cpp-python's verbose=False would dup2 the process's stdout/stderr away during
        # the load: our callback owns llama.cpp's logging.
        params = llama_cpp.llama_model_default_params()
        # the weights as the file holds them: repacked ones (Q4_K, Q6_K, Q4_0… on x86) compute a
        # group of 4 rows otherwise than a row alone, so a decode step beside 3 others changed
        # a sequence's logits (the module's docstring)
        params.use_extra_bufts = False
        self.model = _internals.LlamaModel(path_model=str(self.path), params=params, verbose=True)
        self.parallel = max(1, parallel)
        self.n_layers = llama_cpp.llama_model_n_layer(self.model.model)
        meta = self.model.metadata()
        # an embedding model (BERT: its file names a pooling type) is run to pooled vectors
        # only: no generation context, no decode plan, no chat template
        self.embedding_only = gguf_meta.embedding_only(meta)
        kv_per_token = None if self.embedding_only else self._kv_bytes(meta)
        self.n_ctx = gguf_meta.window(n_ctx, self.model.n_ctx_train(), kv_per_token, self.parallel)
        # the eval callback of the contexts that read residuals (llama_steering.py); kept alive here
        self._eval_callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)
        self._taps: dict = {}  # what the decode running in an observed context reads (llama_steering.py)
        self._tapping = None  # who takes the tensor the eval callback asked for last
        self.batchable = not self.embedding_only
        self.normalize = self.embedding_only and meta.get(NORMALIZE_KEY, "true") == "true"
        self.flash_attn, self.decode_together = (False, False) if self.embedding_only else self._decode_plan()
        # every sequence may fill its whole window: the shared cache holds `parallel` of them
        self.gen = (
            None
            if self.embedding_only
            else _Slots(
                self._context(
                    self.n_ctx * self.parallel,
                    min(self.n_ctx * self.parallel, gguf_meta.GENERATION_UBATCH),
                    self.parallel,
                    self.flash_attn,
                ),
                self.model.n_vocab(),
                self.parallel,
            )
        )
        # prompts a slot drops, kept in host RAM for a later prompt sharing their head (prompt_store.py);
        # `prefix_cache`: the engine actor's status shows it in /metrics, as the transformers engine's
        cache_ram = reuse_budget.reuse_bytes() if cache_ram is None else cache_ram
        self.prefix_cache = PromptStore(cache_ram, kv_per_token) if self.gen is not None and cache_ram > 0 else None
        if self.gen is not None:
            self.gen.store = self.prefix_cache
        self._reader: _Slots | None = None  # one sequence whose residuals are read, made on first use
        self._embedder: _internals.LlamaContext | None = None  # an embeddings context, made on first use
        self.vocab_size = self.scoring_vocab = self.model.n_vocab()
        self._bos = _token_text(self.model, meta.get("tokenizer.ggml.bos_token_id"))
        self._eos = _token_text(self.model, meta.get("tokenizer.ggml.eos_token_id"))
        # llama.cpp's own end-of-generation set: eos, eot and eom, and the tokens its vocabulary
        # loader marks by their text (Gemma's <end_of_turn>, <|endoftext|>, FIM's <reponame>, …):
        # one call per id, through the bare function pointer (the bindings' argument conversion
        # made it 1.6× slower: SmolLM2's 49k ids 18 ms → 11, a 262k vocabulary ~95 → ~60)
        is_eog = ctypes.CFUNCTYPE(ctypes.c_bool)(ctypes.cast(llama_cpp.llama_vocab_is_eog, ctypes.c_void_p).value)
        vocab = ctypes.c_void_p(self.model.vocab)
        self.eos_token_ids = frozenset(t for t in range(self.vocab_size) if is_eog(vocab, t))
        source = chat_template or meta.get("tokenizer.chat_template")  # the config's, over the file's
        template = _environment().from_string(source) if source and not self.embedding_only else None
        self.has_chat_template = template is not None
        # the file's template takes no variables: chat_template_kwargs are reported, never passed
        self.chat = (
            ChatTemplate(
                lambda msgs, gen, tools, _kwargs: template.render(
                    messages=msgs, tools=tools, add_generation_prompt=gen, bos_token=self._bos, eos_token=self._eos
                ),
                source,
            )
            if template is not None
            else None
        )
        # how the model writes a tool call (its template's family): what required/named calls are decoded in
        self.tool_syntax = self.chat.tool_syntax if self.chat is not None else HERMES
        self._constraints: Constraints | None = None  # built at the first constrained request
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "true") != "false"
        quant = quant_label(self.path, meta)  # from llama.cpp's metadata: the header is not read again
        self.info = ModelInfo(
            id=model_id,
            engine="llama.cpp",
            context_length=self.n_ctx,
            dtype=quant,
            device="cpu",
            parameters=self.model.n_params(),
            revision=revision(self.path),
            quantization=quant,
            footprint_bytes=llama_cpp.llama_model_size(self.model.model)
            + (
                gguf_meta.encoder_bytes(llama_cpp.llama_model_n_head(self.model.model), self.n_ctx)
                if self.embedding_only
                else gguf_meta.context_bytes(kv_per_token, self.vocab_size, self.n_ctx * self.parallel)
            ),
        )

    def _kv_bytes(self, meta: dict) -> int:
        """KV cache bytes per token as llama.cpp itself read the model (gguf_meta.kv_bytes): its
        layers and KV heads (layer 0's, where the file has a count per layer: llama.cpp's
        metadata leaves arrays out), and the head widths its metadata records, else n_embd /
        n_head. The pre-load estimate reads the same facts from the header (supervisor/memory.py)."""
        model = self.model.model
        arch = meta.get("general.architecture")
        width = llama_cpp.llama_model_n_embd(model) // max(1, llama_cpp.llama_model_n_head(model))
        key = int(meta.get(f"{arch}.attention.key_length") or width)
        value = int(meta.get(f"{arch}.attention.value_length") or width)
        return gguf_meta.kv_bytes(self.n_layers, llama_cpp.llama_model_n_head_kv(model), key, value)

    def _decode_plan(self) -> tuple[bool, bool]:
        """(flash attention, one llama_decode for all sequences) for the generation context:
        whichever decodes fastest here. Flash attention's CPU kernels win on some CPUs and
        lose on others (SmolLM2 Q4_1, one thread, 4 sequences: +12 % on an AMD EPYC, where it
        also lets llama-server, whose default it is, outrun llama-cpp-python's `Llama`, whose
        default is off). Where decoding is bound by memory traffic (a big model) a batch costs
        about what one sequence does; on a CPU core that computes flat out it costs more than
        the sequences one by one (100m demo, 1 thread: 4 sequences together 126 tok/s, alone
        146) — so the sequences then take turns, one step each, which keeps the fairness of
        batching without its cost. Measured at a file's first load in a small context each way
        (after an 8-token prefill and a warm step: 3 rounds of a step of n one-token sequences and of n
        steps of one; the minimum of each), and kept in the cache root by file (path, size,
        mtime_ns), threads, n and llama.cpp's version; a later load reads the answer (bench/
        gguf_start_load.py). Either choice is laid out alike for every request, so a request's
        text still depends on nothing else (the module's docstring)."""
        import os

        from ..demo.demo_model import default_cache_dir

        n = min(self.parallel, 4)
        stat = self.path.stat()
        key = (
            f"{self.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|threads={self.threads}|n={n}"
            f"|cpus={os.cpu_count()}|llama_cpp={llama_cpp.__version__}|unrepacked|plan"
        )
        store = default_cache_dir() / "llama-cpp-decode.json"
        try:
            known = json.loads(store.read_text())
        except (OSError, ValueError):
            known = {}
        known = known if isinstance(known, dict) else {}
        plan = known.get(key)
        if isinstance(plan, list) and len(plan) == 2 and all(isinstance(x, bool) for x in plan):
            return plan[0], plan[1]
        token = max(self.model.token_bos(), 0)
        timings = {}  # (flash attention, together) -> the fastest step of n tokens
        for flash in (False, True):
            ctx = self._context(PROBE_CELLS * n, PROBE_CELLS, n, flash_attn=flash)
            try:
                prompt = PROBE_PROMPT  # a few cells to attend over, prefilled for all at once
                _timed_step(ctx, token, [(seq, pos) for seq in range(n) for pos in range(prompt)], logits=False)
                _timed_step(ctx, token, [(seq, prompt) for seq in range(n)])  # warm: buffers sized for n rows
                together, apart = [], []
                for pos in range(prompt + 1, prompt + 7, 2):
                    together.append(_timed_step(ctx, token, [(seq, pos) for seq in range(n)]))
                    apart.append(sum(_timed_step(ctx, token, [(seq, pos + 1)]) for seq in range(n)))
                timings[flash, True], timings[flash, False] = min(together), min(apart)
            finally:
                ctx.close()
        if n < 2:  # one sequence: there is nothing to decode together
            timings = {plan: t for plan, t in timings.items() if not plan[1]}
        log.debug(
            "llama.cpp decode, %d sequences: %s",
            n,
            ", ".join(
                f"{'flash' if f else 'plain'} {'together' if t else 'in turns'} {s * 1e3:.1f} ms"
                for (f, t), s in timings.items()
            ),
        )
        answer = min(timings, key=timings.get)
        known = dict(list(known.items())[-255:]) | {key: list(answer)}  # the newest 256 answers
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            part = store.with_name(f"{store.name}.{os.getpid()}")
            part.write_text(json.dumps(known))
            os.replace(part, store)  # atomic: actors loading side by side never read half a file
        except OSError:
            pass  # an unwritable cache only costs the next load its probe
        return answer

    def _context(
        self,
        n_ctx: int,
        n_batch: int,
        n_seq: int,
        flash_attn: bool = False,
        embeddings: bool = False,
        observed: bool = False,
        threads: int | None = None,
    ) -> _internals.LlamaContext:
        """`observed`: with the eval callback, so residuals can be read (a call per graph node).
        `threads`: the engine's own (`self.threads`) unless given.
        `flash_attn` only where it was measured faster (`_decode_plan`), for the contexts that
        generate, and the one that embeds (`_embedding_context`); those that score and echo
        compute as llama-cpp-python's `Llama` does by default."""
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        params.n_threads = params.n_threads_batch = threads or self.threads
        # a KV stream per sequence, each of n_ctx / n_seq cells: a sequence's cells are laid out
        # alike whatever ran before it (one shared cache placed them wherever there was room,
        # and the results depended on it: the module's docstring)
        params.kv_unified = False
        params.swa_full = True  # sliding-window layers: a cell per position too, none dropped (the default)
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        if embeddings:
            # the file's pooling for an embedding model; the spec's mean for a causal LM. Its
            # sequences are packed into one ubatch and cleared after it: one cache they share
            params.embeddings, params.kv_unified = True, True
            params.pooling_type = (
                llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if self.embedding_only else llama_cpp.LLAMA_POOLING_TYPE_MEAN
            )
        if observed:
            params.cb_eval = self._eval_callback
        return _internals.LlamaContext(model=self.model, params=params, verbose=True)

    @functools.cached_property
    def steering(self):
        """SAEs, steering and readouts (llama_steering.py), made when first asked for: torch is
        imported then, not at every load."""
        from .llama_steering import CvecSteering

        return CvecSteering(self, self.n_layers)

    def _steering(self):
        """The steering, if it was ever asked for (without making it)."""
        return self.__dict__.get("steering")

    def _on_tensor(self, tensor, ask: bool, _user_data) -> bool:
        """llama.cpp's eval callback: asked about every node of an observed context's graph
        (`ask`), then given each one it said it wants, once computed; True goes on."""
        if ask:
            if not self._taps:
                return False
            self._tapping = self._taps.get(_ggml.ggml_get_name(tensor))
            return self._tapping is not None
        n = _ggml.ggml_nelements(tensor)
        rows = np.empty(n, dtype=np.float32)  # l_out is float32: [positions, n_embd]
        _ggml.ggml_backend_tensor_get(tensor, rows.ctypes.data, 0, n * 4)
        take, self._tapping = self._tapping, None
        take(rows.reshape(-1, self.model.n_embd()))
        return True

    def _reads_last_layer(self) -> bool:
        """Whether a forward on this thread reads the last layer's residuals, where llama.cpp
        computes only the positions it outputs."""
        steering = self._steering()
        return steering is not None and residual_name(self.n_layers - 1) in steering.taps()

    def _observed(self, ctx: _internals.LlamaContext, batch) -> int:
        """llama_decode in an observed context, its eval callback reading what this thread's
        forward reads now (`_taps`)."""
        steering = self._steering()
        self._taps = steering.taps() if steering is not None else {}
        try:
            return llama_cpp.llama_decode(ctx.ctx, batch.batch)
        finally:
            self._taps, self._tapping = {}, None

    def residuals(self, prompt_ids: list[int]) -> None:
        """One unsteered pass over `prompt_ids` in the scoring context: what the steering's
        calibration reads (CvecSteering._residual_norm)."""
        for _ in self._scoring_pass(prompt_ids, every=False):
            pass

    def unembedding(self):
        """W_U [rows, n_embd] as a float32 torch tensor, dequantised from the file (its `output`
        tensor, else the tied token embeddings): what a feature's logit effects go through
        (engines/dashboards.py). Read when asked, not kept."""
        import torch
        from gguf import GGUFReader, dequantize

        tensors = {t.name: t for t in GGUFReader(self.path).tensors}
        weight = tensors.get("output.weight") or tensors["token_embd.weight"]
        rows = dequantize(weight.data, weight.tensor_type).reshape(-1, self.model.n_embd())
        return torch.from_numpy(rows.astype("float32", copy=True))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # as transformers does: special tokens written in the text are parsed as such
        return self.model.tokenize(text.encode("utf-8"), add_bos=add_special_tokens and self._add_bos, special=True)

    def render_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        generation_prompt: bool = True,
    ) -> list[int]:
        """The file's own template (or the config's); `template_kwargs` never reach it (the
        ledger reports them). The rendered text carries the template's own BOS."""
        return self.tokenize(self.chat.render(messages, tools, None, generation_prompt), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.model.detokenize(ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return _token_text(self.model, token_id)

    def generate_ids(
        self, prompt_ids: list[int], params: SamplingParams, matcher=None, readout=None, monitor=None
    ) -> Iterator[tuple[int, float]]:
        """The serial path: one sequence slot, decoded alone. With a `matcher`
        (constraints.Matcher) every step's logits row is masked in place to what its grammar
        allows before the sequence's sampler reads it; with a `readout` and/or a `monitor`
        (steering.py) the sequence runs in the reading context, whose every forward they read."""
        observers = (readout, monitor)
        observed = readout is not None or monitor is not None
        slots = self._reading(len(prompt_ids) + (params.max_tokens or 0)) if observed else self.gen
        reading = self.steering.reading(*observers) if observed else contextlib.nullcontext()
        with reading:
            seq = self._open(prompt_ids, params, matcher, slots)
        try:
            while True:
                yield seq.next_id, seq.logprob, seq.top
                with reading:
                    self._decode([seq])
                seq.sample(0)
        finally:
            self._close(seq)

    def new_batch(self, sampling: SamplingParams) -> LlamaCppBatch:
        """Sequences decoded together; each keeps its own sampling parameters."""
        return LlamaCppBatch(self)

    # sequences ---------------------------------------------------------------------
    def _open(
        self, prompt_ids: list[int], params: SamplingParams, matcher=None, slots: _Slots | None = None
    ) -> _Sequence:
        """Take the free slot whose stream holds the longest prefix of the prompt (prompt
        tokens it prefilled under the control vector this prefill adds: never generated ones),
        keep that prefix's whole grid cells — or, where the RAM store holds a longer prefix
        (prompt_store.py), copy that one's cells into the slot holding least —, prefill the
        rest in the grid's cells (`_chunks`: the module's docstring says why) and sample the
        first token. What the slot held past the kept prefix is kept in the store first
        (`_keep`). A forward that reads the last layer's residuals computes every position
        there (llama.cpp keeps only the rows it outputs in the last layer)."""
        self._generative()
        slots = slots or self.gen
        if not slots.free:
            raise EngineError("queue_full", f"all {len(slots.live)} sequence slots of the model are in use")
        vector = self._set_vector(slots)
        own = {
            slot: _reusable(tokens, prompt_ids) if key == vector and slots.reuse else 0
            for slot, (key, tokens) in slots.free.items()
        }
        # ties: the slot with the least cached (a fresh prompt keeps the others' prefixes)
        slot = max(own, key=lambda slot: (own[slot], -len(slots.free[slot][1]), -slot))
        store, state = slots.store, None
        if store is not None and store.longest(vector, prompt_ids)[0] > own[slot]:
            slot = min(own, key=lambda slot: (len(slots.free[slot][1]), slot))
            self._keep(slots, slot, 0)
            reused, state = store.longest(vector, prompt_ids)  # again: keeping may have evicted it
        else:
            reused = own[slot]
            self._keep(slots, slot, reused)
        del slots.free[slot]
        memory = slots.ctx.memory
        if state is not None and not self._restore(slots, slot, state, reused):
            reused = 0
        elif state is None and (not reused or not llama_cpp.llama_memory_seq_rm(memory, slot, reused, -1)):
            llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)  # nothing kept (or this cache cannot be cut)
            reused = 0
        if store is not None:
            store.served(reused, state if reused else None)
        seq = _Sequence(
            slots, slot, _sampler(self.vocab_size, self.n_ctx, params, prompt_ids), matcher, params.logprobs
        )
        seq.vector, seq.prefilled = vector, prompt_ids[:reused]
        slots.live[slot] = seq
        every, last = self._reads_last_layer(), len(prompt_ids) - 1
        try:
            for start, end in _chunks(reused, len(prompt_ids)):
                batch = _batch([(prompt_ids[i], i, seq.slot, every or i == last) for i in range(start, end)])
                self._run(slots, batch)
                seq.prefilled += prompt_ids[start:end]
            seq.length = len(prompt_ids)
            seq.sample(end - start - 1)
        except BaseException:
            seq.prefilled = []  # what reached the cache is unknown
            self._close(seq)
            raise
        return seq

    def _keep(self, slots: _Slots, slot: int, kept: int) -> None:
        """Before free `slot` is cut to its first `kept` tokens: copy its prompt's whole grid
        cells into the RAM store (llama.cpp's bytes of that sequence's cells) when they are more
        than that and no stored state holds them yet. The cells past them (a part cell, the
        generated tokens') are cut first: a stored state is prompt cells alone."""
        store = slots.store
        key, tokens = slots.free[slot]
        cells = len(tokens) // PREFILL_GRID * PREFILL_GRID
        if store is None or cells <= kept or store.holds(key, tokens[:cells]):
            return
        if not llama_cpp.llama_memory_seq_rm(slots.ctx.memory, slot, cells, -1):
            return
        ctx = slots.ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, slot)
        if size > store.max_bytes:
            return
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(ctx, data, size, slot) == size:
            store.put(key, tokens[:cells], data)

    def _restore(self, slots: _Slots, slot: int, state: State, reused: int) -> bool:
        """Copy a stored prompt's cells into `slot` (which llama.cpp empties first: the cells
        land from the stream's first on, where a prefill puts them) and cut them to `reused`."""
        ctx, memory = slots.ctx.ctx, slots.ctx.memory
        if llama_cpp.llama_state_seq_set_data(ctx, state.data, len(state.data), slot) == 0:
            llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)
            return False
        if reused == len(state.tokens) or llama_cpp.llama_memory_seq_rm(memory, slot, reused, -1):
            return True
        llama_cpp.llama_memory_seq_rm(memory, slot, -1, -1)
        return False

    def _decode(self, seqs: list[_Sequence]) -> None:
        """One step: each sequence's last sampled token, at its next position (one context's)."""
        slots = seqs[0].slots
        self._set_vector(slots)
        batch = _batch([(seq.next_id, seq.length, seq.slot, True) for seq in seqs])
        for seq in seqs:
            seq.length += 1
        self._run(slots, batch)

    def _run(self, slots: _Slots, batch) -> None:
        code = (
            self._observed(slots.ctx, batch) if slots.observed else llama_cpp.llama_decode(slots.ctx.ctx, batch.batch)
        )
        if code != 0:
            raise EngineError("generation_failed", f"llama_decode failed (code {code})")

    def _set_vector(self, slots: _Slots) -> bytes | None:
        """Make the context's control vector the one a decode on this thread adds now (the live
        steering, or a request's own: llama_steering.py); its key (None: none)."""
        steering = self._steering()
        key, vector = steering.control_vector() if steering is not None else (None, None)
        if key != slots.vector:
            if vector is None:
                code = llama_cpp.llama_set_adapter_cvec(slots.ctx.ctx, None, 0, self.model.n_embd(), -1, -1)
            else:
                data, start, end = vector
                pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                code = llama_cpp.llama_set_adapter_cvec(
                    slots.ctx.ctx, pointer, data.size, self.model.n_embd(), start, end
                )
            if code != 0:
                raise EngineError("generation_failed", f"llama.cpp refused the control vector (code {code})")
            slots.vector = key
        return key

    def _reading(self, n_tokens: int) -> _Slots:
        """The reading context (one sequence, the eval callback on, no prefix kept: every position
        of a read sequence is computed and read), made or remade to hold `n_tokens` — a window
        of the smallest power of two holding them (at least 512, at most the model's). Only the
        serial path reads, so it is free whenever this is asked."""
        self._generative()
        size = min(self.n_ctx, max(512, 1 << max(n_tokens - 1, 1).bit_length()))
        if self._reader is None or self._reader.ctx.n_ctx() < size:
            if self._reader is not None:
                self._reader.ctx.close()
            context = self._context(size, min(size, 512), 1, self.flash_attn, observed=True)  # as gen: the same text
            self._reader = _Slots(context, self.vocab_size, 1, reuse=False, observed=True)
        return self._reader

    def _close(self, seq: _Sequence) -> None:
        """Free the slot, keeping its prefilled prompt (and the control vector it was prefilled
        under) for a prompt that shares its prefix; the generated tokens' cells stay until the
        next sequence cuts them."""
        slots = seq.slots
        if not seq.prefilled:
            llama_cpp.llama_memory_seq_rm(slots.ctx.memory, seq.slot, -1, -1)
        if seq.sampler is not None:
            llama_cpp.llama_sampler_free(seq.sampler)
        del slots.live[seq.slot]
        slots.free[seq.slot] = (seq.vector, seq.prefilled)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled vector per input, from a context of their own in embeddings mode (the
        weights are shared). Inputs are packed in order into decodes of up to gguf_meta.embed_tokens
        tokens (256 on one thread, 512 on more) and EMBED_SEQUENCES sequences, each input whole in
        one decode (llama.cpp pools a sequence within its ubatch; a longer input is decoded alone):
        128 inputs of ~40 tokens are 22 or 10 decodes, not 128. Pooled as the file says (`{arch}.pooling_type`; a causal LM: the mean
        of its last hidden states) and L2-normalised as it says (bert_gguf.NORMALIZE_KEY; an
        embedding model that does not say is normalised, as llama-server does)."""
        ctx = self._embedding_context()
        width = self.model.n_embd()
        pooled = np.empty((len(inputs), width), dtype=np.float32)
        tokens = gguf_meta.embed_tokens(self.embed_threads)
        for group in _packed([len(ids) for ids in inputs], tokens, EMBED_SEQUENCES):
            if ctx.memory is not None:  # an encoder (BERT) keeps no cache
                llama_cpp.llama_memory_clear(ctx.memory, True)
            batch = _SequencesBatch([inputs[i] for i in group])
            code = llama_cpp.llama_decode(ctx.ctx, batch.batch)
            if code != 0:
                raise EngineError("generation_failed", f"llama_decode failed while embedding (code {code})")
            for seq, i in enumerate(group):
                ctypes.memmove(pooled[i].ctypes.data, llama_cpp.llama_get_embeddings_seq(ctx.ctx, seq), 4 * width)
        vectors = pooled.astype(np.float64)
        if self.normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors.tolist()

    def _embedding_context(self) -> _internals.LlamaContext:
        if self._embedder is None:
            size = gguf_meta.embedding_ubatch(self.n_ctx)
            # flash attention, as llama-server embeds: all-MiniLM's 128 inputs of ~40 tokens in
            # 512-token ubatches took a third of the time with it (one thread; the masked
            # attention across a ubatch's sequences is most of the work without it)
            self._embedder = self._context(
                size, size, EMBED_SEQUENCES, flash_attn=True, embeddings=True, threads=self.embed_threads
            )
        return self._embedder

    def _generative(self) -> None:
        """Refuse what only a generating model does (generation, scoring, residual reads) on an
        embedding model: it has no output head, only pooled vectors."""
        if self.embedding_only:
            raise EngineError(
                "invalid_parameter",
                f"model {self.info.id!r} is an embedding model: it serves embeddings only, no generation or scoring",
                "model",
            )

    # scoring ------------------------------------------------------------------------
    def score(
        self, prompt_ids: list[int], temperature: float, allowed: list[int] | None, report: int, readout=None
    ) -> Scored:
        """Scoring mode from llama.cpp's own logits (llama_get_logits) of the prompt's last
        position, through the scoring context — never a generation slot, never steered; a
        prompt sharing a prefix with the one scored before it prefills only the rest. With a
        `readout` (steering.py), every position is computed and read on that pass."""
        last = None
        with self._read_unsteered(readout):
            for _, rows in self._scoring_pass(prompt_ids, every=False):
                last = rows[-1].astype(np.float64)
        return score_row(last, self.scoring_vocab, temperature, allowed, report)

    def prompt_logprobs(
        self,
        prompt_ids: list[int],
        temperature: float,
        report: int,
        allowed: list[int] | None = None,
        next_report: int | None = None,
        readout=None,
    ) -> Echoed:
        """Every prompt token's log-probability (`echo`) from the logits of every position, one
        cell of the prefill grid at a time, each reduced before the next is decoded."""
        tokens, last = [], None
        with self._read_unsteered(readout):
            for start, rows in self._scoring_pass(prompt_ids, every=True):
                targets = prompt_ids[start + 1 : start + 1 + len(rows)]
                tokens += prompt_tokens(
                    rows[: len(targets)], targets, self.scoring_vocab, temperature, report, first=start + 1
                )
                last = rows[-1].astype(np.float64)
        scored = None if next_report is None else score_row(last, self.scoring_vocab, temperature, allowed, next_report)
        return Echoed(tokens, scored)

    def _read_unsteered(self, readout):
        """A scoring pass's scope: what the request's `readout` reads there is the unsteered model
        (the scoring context never holds a control vector), as on transformers."""
        if readout is None:
            return contextlib.nullcontext()
        scope = contextlib.ExitStack()
        scope.enter_context(self.steering.suppressed())
        scope.enter_context(self.steering.reading(readout))
        return scope

    def _scoring_pass(self, prompt_ids: list[int], every: bool):
        """Decode the prompt in the scoring context; yield (start, logits rows) per chunk — every
        position's with `every`, else the last position's alone (once). The logits are llama.cpp's
        buffer, valid until the next decode. The context keeps the last prompt's cache, so
        while nothing is read before the last position a shared prefix is kept; `every`, or a
        residual read (a readout, the calibration), computes the whole prompt. As a
        generation's prefill, in the prefill grid's cells (`_chunks`): the logits equal a
        whole-prompt pass's, bit for bit."""
        ctx = self._scoring_context(len(prompt_ids))
        memory = ctx.memory
        steering = self._steering()
        whole = every or bool(steering is not None and steering.taps())
        kept = 0 if whole else _reusable(self._scored, prompt_ids)
        if not llama_cpp.llama_memory_seq_rm(memory, 0, kept, -1):
            llama_cpp.llama_memory_clear(memory, True)
            kept = 0
        self._scored = prompt_ids[:kept]
        # llama.cpp computes only the positions it outputs through the last layer
        outputs_all = every or self._reads_last_layer()
        for start, end in _chunks(kept, len(prompt_ids)):
            part = prompt_ids[start:end]
            last = end == len(prompt_ids)
            batch = _batch(
                [(token, start + i, 0, outputs_all or (last and i == len(part) - 1)) for i, token in enumerate(part)]
            )
            code = self._observed(ctx, batch)
            if code != 0:
                llama_cpp.llama_memory_clear(memory, True)
                self._scored = []
                raise EngineError("generation_failed", f"llama_decode failed while scoring (code {code})")
            self._scored = self._scored + part
            outputs = len(part) if outputs_all else int(last)
            if outputs:
                rows = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx.ctx), shape=(outputs, self.vocab_size))
                if every or last:
                    yield start, rows if every else rows[-1:]

    def _scoring_context(self, n_tokens: int) -> _internals.LlamaContext:
        """The scoring context: one sequence of its own, apart from the generation context's slots,
        so a scoring pass between two decode steps leaves every slot's cache as it was (the engine
        actor's one worker thread runs both, never at once). Made at the first scoring request and
        remade larger for a longer prompt: a window of the smallest power of two holding it (at
        least 512 cells, at most the model's window), so a short judge prompt keeps a small cache."""
        self._generative()
        ctx = self.__dict__.get("_scorer")
        if ctx is not None and ctx.n_ctx() >= n_tokens:
            return ctx
        if ctx is not None:
            ctx.close()
            self._scorer = None
        size = min(self.n_ctx, max(512, 1 << max(n_tokens - 1, 1).bit_length()))
        self._scorer = self._context(size, PREFILL_GRID, 1, observed=True)  # logits: a cell's rows
        self._scored: list[int] = []  # the tokens in its cache
        return self._scorer

    def compile_constraint(self, spec: Constraint):
        """A grammar for the constraint (calls in the template's own syntax), from the transformers engine's constraint module; compiled grammars are
        cached. Its tokenizer is read from the vocabulary at the first constrained request
        (~0.3 s for SmolLM2's 49k tokens), not at every load."""
        if self._constraints is None:
            self._constraints = Constraints(self.model.vocab, self.vocab_size, self.eos_token_ids)
        return self._constraints.compile(spec, self.tool_syntax)

    def matcher(self, grammar):
        """A fresh matcher of a compiled grammar, for one sequence."""
        return self._constraints.matcher(grammar)

    def unload(self) -> None:
        contexts = (
            self._embedder,
            self.__dict__.get("_scorer"),
            self._reader and self._reader.ctx,
            self.gen and self.gen.ctx,
        )
        for ctx in contexts:  # the contexts before the model
            if ctx is not None:
                ctx.close()
        self.model.close()


class _Slots:
    """A context and its sequence slots (a KV stream each). A free slot keeps the prompt tokens
    its stream prefilled and the key of the control vector they were prefilled under, for a
    prompt that shares the prefix (`reuse`); `vector` is the key of the one the context holds."""

    def __init__(self, ctx: _internals.LlamaContext, n_vocab: int, n: int, reuse: bool = True, observed: bool = False):
        self.ctx, self.n_vocab, self.reuse, self.observed = ctx, n_vocab, reuse, observed
        self.free: dict[int, tuple[bytes | None, list[int]]] = {slot: (None, []) for slot in range(n)}
        self.live: dict[int, _Sequence] = {}
        self.vector: bytes | None = None
        self.store: PromptStore | None = None  # where prompts a slot drops are kept (the generation context's)
        self.scratch = np.empty(n_vocab, np.float32)  # a sampled row's normaliser is computed here


class _Sequence:
    """One sequence in a slot of a context: where it is, and its sampled next token."""

    def __init__(self, slots: _Slots, slot: int, sampler, matcher=None, report: int | None = None):
        self.slots, self.slot, self.sampler, self.matcher = slots, slot, sampler, matcher
        self.report = report or 0  # the most probable tokens reported at each position
        self.length = 0  # tokens in the cache: the next one's position
        self.prefilled: list[int] = []  # the prompt tokens its stream holds, from position 0
        self.vector: bytes | None = None  # the key of the control vector they were prefilled under
        self.next_id, self.logprob, self.top = -1, 0.0, ()

    def sample(self, idx: int) -> None:
        """Sample from batch row `idx` (masked first by the sequence's grammar, if any): the
        row is llama.cpp's own buffer, which the sampler reads after the mask."""
        ctx = self.slots.ctx.ctx
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, idx), shape=(self.slots.n_vocab,))
        if self.matcher is not None:
            self.matcher.mask(row)
        if self.sampler is not None:
            self.next_id = llama_cpp.llama_sampler_sample(self.sampler, ctx, idx)  # also accepts it
        else:
            self.next_id = int(row.argmax())
            if row[self.next_id] != row[self.next_id]:  # NaN: llama.cpp's greedy pick, as the chain's
                greedy = llama_cpp.llama_sampler_init_greedy()
                self.next_id = llama_cpp.llama_sampler_sample(greedy, ctx, idx)
                llama_cpp.llama_sampler_free(greedy)
        if self.matcher is not None:
            self.matcher.consume(self.next_id)
        # the model's log-probabilities at temperature 1 (after the sampler: a mask leaves
        # -inf); exp in float32 into the slots' buffer, summed in float64
        peak = row.max()
        shifted = np.subtract(row, peak, out=self.slots.scratch)
        norm = float(peak) + float(np.log(np.exp(shifted, out=shifted).sum(dtype=np.float64)))
        self.logprob = float(row[self.next_id]) - norm
        if self.report:
            best = np.argpartition(row, -self.report)[-self.report :]
            best = best[np.argsort(-row[best], kind="stable")]
            self.top = tuple((int(i), float(row[i]) - norm) for i in best)


class LlamaCppBatch:
    """The continuous batch (the engine actor's interface, as batching.DecodeBatch): sequences
    join at step boundaries, prefilled on their own, and leave when they finish."""

    prefills_together = False  # each joiner's prompt is a llama_decode of its own (the module's docstring)

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
        delta = decoder.feed(seq.next_id, seq.logprob, seq.top)
        if delta.finish_reason is None:
            self._seqs[key] = (seq, decoder)
        else:
            self._engine._close(seq)
        return delta

    def step(self) -> list[tuple[object, Delta]]:
        """One token for every sequence: one llama_decode for all, or one each where that
        measured faster (LlamaCppEngine._decode_plan)."""
        engine, rows = self._engine, list(self._seqs.items())
        if engine.decode_together:
            # in slot order: llama.cpp puts only sequences of consecutive ids in one ubatch when
            # each has a KV stream of its own (split_equal), so slots 2, 0, 1 took two ubatches
            rows.sort(key=lambda row: row[1][0].slot)
            engine._decode([seq for _, (seq, _) in rows])
            for i, (_, (seq, _)) in enumerate(rows):
                seq.sample(i)
        else:
            for _, (seq, _) in rows:
                engine._decode([seq])
                seq.sample(0)
        out = [(key, decoder.feed(seq.next_id, seq.logprob, seq.top)) for key, (seq, decoder) in rows]
        self.leave([key for key, delta in out if delta.finish_reason])
        return out

    def leave(self, keys) -> None:
        for key in keys:
            seq, _ = self._seqs.pop(key, (None, None))
            if seq is not None:
                self._engine._close(seq)


def residual_name(block: int) -> bytes:
    """The name llama.cpp gives the residual stream after `block` (its control vector added)."""
    return f"l_out-{block}".encode()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _reusable(cached: list[int], prompt_ids: list[int]) -> int:
    """How many of a slot's cached prompt tokens a prompt reuses: their common prefix, in
    whole cells of the prefill grid, leaving at least one token to prefill (its logits)."""
    return min(_common_prefix(cached, prompt_ids), len(prompt_ids) - 1) // PREFILL_GRID * PREFILL_GRID


def _chunks(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end), `start` on the prefill grid, in the grid's cells: each position of a
    prompt is computed in the same ubatch whatever was reused before it (the module's
    docstring)."""
    return [(at, min(at + PREFILL_GRID, end)) for at in range(start, end, PREFILL_GRID)]


def _batch(rows: list[tuple[int, int, int, bool]]) -> _internals.LlamaBatch:
    """A batch of (token, position, sequence, logits wanted) rows."""
    batch = _internals.LlamaBatch(n_tokens=len(rows), embd=0, n_seq_max=1, verbose=False)
    b = batch.batch
    for i, (token, pos, seq_id, logits) in enumerate(rows):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq_id
    b.n_tokens = len(rows)
    return batch


class _SequencesBatch:
    """A batch of whole sequences, the i-th input as sequence i from position 0, every row an
    output: its arrays built by numpy, not a row at a time (an embedding request's ~5,000 rows
    took ~5 ms through `_batch`). `batch` points into this object's arrays: valid while it lives."""

    def __init__(self, inputs: list[list[int]]):
        lengths = np.fromiter(map(len, inputs), dtype=np.int64, count=len(inputs))
        n = int(lengths.sum())
        self.token = np.fromiter((t for ids in inputs for t in ids), dtype=np.int32, count=n)
        self.pos = (np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
        self.seq = np.repeat(np.arange(len(inputs), dtype=np.int32), lengths)
        self.seq_ptrs = self.seq.ctypes.data + 4 * np.arange(n, dtype=np.uint64)  # row i's one sequence id
        self.ones = np.ones(n, dtype=np.int32)  # one sequence a row
        self.outputs = np.ones(n, dtype=np.int8)
        int32_p = ctypes.POINTER(ctypes.c_int32)
        self.batch = llama_cpp.llama_batch(
            n_tokens=n,
            token=self.token.ctypes.data_as(int32_p),
            embd=None,
            pos=self.pos.ctypes.data_as(int32_p),
            n_seq_id=self.ones.ctypes.data_as(int32_p),
            seq_id=self.seq_ptrs.ctypes.data_as(ctypes.POINTER(int32_p)),
            logits=self.outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )


def _packed(lengths: list[int], tokens: int, sequences: int) -> list[list[int]]:
    """The indices of inputs of these lengths, in order, in groups of at most `tokens` tokens
    (an input longer than that in a group of its own) and `sequences` inputs."""
    groups, size = [], 0
    for i, n in enumerate(lengths):
        if not groups or size + n > tokens or len(groups[-1]) == sequences:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups


def _timed_step(ctx, token: int, rows: list[tuple[int, int]], logits: bool = True) -> float:
    """Seconds for one llama_decode of `token` at these (sequence, position) rows, with logits
    for each or for none (a prefill: the head over every row would cost most of it)."""
    batch = _batch([(token, pos, seq, logits) for seq, pos in rows])
    start = time.perf_counter()
    if llama_cpp.llama_decode(ctx.ctx, batch.batch) != 0:
        raise EngineError("generation_failed", "llama_decode failed while measuring decode speed")
    return time.perf_counter() - start


def _sampler(n_vocab: int, window: int, params: SamplingParams, prompt_ids: list[int]):
    """The sequence's sampler chain, in the order our transformers sampling applies them
    (sampling.py): repetition penalty over everything seen, top-k, temperature, top-p, then
    the draw, from a generator of the sequence's own seeded with the request's seed. None
    for plain greedy decoding (no penalty): the sequence takes the argmax itself — the
    token llama.cpp's greedy sampler picks, without its copy of the row into candidates
    (SmolLM2's 49k: 65 µs a step against 3)."""
    greedy = params.temperature < GREEDY_BELOW or params.top_k == 1
    if greedy and params.repetition_penalty == 1.0:
        return None
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731
    if params.repetition_penalty != 1.0:
        add(llama_cpp.llama_sampler_init_penalties(n_vocab, window, params.repetition_penalty, 0.0, 0.0))
        for token in prompt_ids:  # as HF's penalty counts the prompt
            llama_cpp.llama_sampler_accept(chain, token)
    if greedy:
        add(llama_cpp.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(llama_cpp.llama_sampler_init_top_k(params.top_k))
    add(llama_cpp.llama_sampler_init_temp(params.temperature))
    if params.top_p < 1.0:
        add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    add(llama_cpp.llama_sampler_init_dist(dist_seed(params.seed)))
    return chain


def dist_seed(seed: int | None) -> int:
    """The dist sampler's seed for a request's: llama.cpp reads LLAMA_DEFAULT_SEED (2³²−1) as
    "draw one at random", which is what an unseeded request gets; a request seeded 2³²−1 is
    given 2³²−2 instead (the one pair of seeds that draw alike)."""
    if seed is None:
        return llama_cpp.LLAMA_DEFAULT_SEED
    return min(seed, llama_cpp.LLAMA_DEFAULT_SEED - 1)


def _token_text(model: _internals.LlamaModel, token_id) -> str:
    return "" if token_id is None else model.detokenize([int(token_id)], special=True).decode("utf-8", errors="replace")


def _environment() -> jinja2.Environment:
    """The sandbox chat templates run in, with the helpers Hugging Face templates expect."""

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    return env
