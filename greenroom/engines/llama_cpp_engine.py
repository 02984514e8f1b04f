"""The llama.cpp engine: one GGUF file through llama-cpp-python, on the CPU.

Like every engine it only turns prompt ids into token ids, one per step; stops,
detokenisation and finish reasons are generation.py's. A `Llama` is not
thread-safe: the engine actor's single worker thread is its only caller.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import io
import json
import logging
from pathlib import Path
from typing import Iterator

import jinja2
import jinja2.sandbox
import llama_cpp
import numpy as np

from .base import GREEDY_BELOW, EngineError, ModelInfo, SamplingParams, default_cpu_threads
from .capabilities import ENGINES
from .chat import render_conversation
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


class _LogWriter(io.TextIOBase):
    """llama-cpp-python's own prints during a load (metadata, template choice), to the log."""

    def write(self, text: str) -> int:
        if text.strip():
            log.debug("%s", text.rstrip("\n"))
        return len(text)


class LlamaCppEngine:
    capabilities = ENGINES["llama.cpp"]

    def __init__(self, model_id: str, path: str | Path, n_ctx: int | None = None, threads: int | None = None):
        self.path = Path(path)
        self.threads = threads or default_cpu_threads()
        # verbose=False would dup2 the process's stdout/stderr away during the load: our
        # callback owns llama.cpp's logging, and the Python-side prints go to the log.
        with contextlib.redirect_stdout(_LogWriter()), contextlib.redirect_stderr(_LogWriter()):
            probe = llama_cpp.Llama(str(self.path), vocab_only=True, verbose=True)
            trained = int(probe.metadata.get(f"{probe.metadata['general.architecture']}.context_length", 0)) or None
            probe.close()
            self.n_ctx = min(n_ctx or trained or 4096, trained or n_ctx or 4096)
            self.llm = llama_cpp.Llama(str(self.path), n_ctx=self.n_ctx, n_batch=min(self.n_ctx, 512),
                                       n_threads=self.threads, n_threads_batch=self.threads, verbose=True)
        self.llm.verbose = False  # no per-call prints from generate()
        self._embedder: llama_cpp.Llama | None = None  # an embeddings context, made on first use
        meta = self.llm.metadata
        self.vocab_size = self.scoring_vocab = self.llm.n_vocab()
        self._bos = _token_text(self.llm, meta.get("tokenizer.ggml.bos_token_id"))
        self._eos = _token_text(self.llm, meta.get("tokenizer.ggml.eos_token_id"))
        self.eos_token_ids = frozenset(
            int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                   "tokenizer.ggml.eom_token_id") if k in meta)
        self._template = _environment().from_string(meta["tokenizer.chat_template"]) \
            if meta.get("tokenizer.chat_template") else None
        self.has_chat_template = self._template is not None
        self._add_bos = meta.get("tokenizer.ggml.add_bos_token", "true") != "false"
        quant = quant_label(self.path)
        self.info = ModelInfo(
            id=model_id,
            engine="llama.cpp",
            context_length=self.n_ctx,
            dtype=quant,
            device="cpu",
            parameters=int(self.llm.n_params() if hasattr(self.llm, "n_params") else
                           llama_cpp.llama_model_n_params(self.llm.model)),
            revision=meta.get("general.name"),
            quantization=quant,
        )

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # as transformers does: special tokens written in the text are parsed as such
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special_tokens and self._add_bos, special=True)

    def render_chat(self, messages: list[dict], template_kwargs: dict | None = None,
                    tools: list[dict] | None = None) -> list[int]:
        """The file's own template; `template_kwargs` never reach it (the ledger reports them)."""
        if self._template is None:
            raise ValueError("the GGUF file has no chat template")

        def apply(msgs: list[dict], add_generation_prompt: bool) -> str:
            return self._template.render(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt,
                                         bos_token=self._bos, eos_token=self._eos)

        # the rendered text carries the template's own BOS
        return self.tokenize(render_conversation(apply, messages), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def generate_ids(self, prompt_ids: list[int], params: SamplingParams,
                     matcher=None) -> Iterator[tuple[int, float]]:
        if matcher is not None:  # the ledger refuses response_format and tools before this
            raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                              "response_format")
        greedy = params.temperature < GREEDY_BELOW
        # min_p off: OpenAI's sampling has only temperature, top_p and top_k
        steps = self.llm.generate(prompt_ids, top_k=params.top_k, top_p=params.top_p, min_p=0.0,
                                  temp=0.0 if greedy else params.temperature,
                                  repeat_penalty=params.repetition_penalty, reset=True)
        try:
            for token in steps:
                yield token, self._logprob(token)
        finally:
            steps.close()

    def _logprob(self, token: int) -> float:
        """The model's log-probability of `token` at temperature 1, from the last position's
        logits (still in the context: the next eval runs when the next token is asked for)."""
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.vocab_size,))
        top = float(row.max())
        return float(row[token] - top - np.log(np.exp(row - top, dtype=np.float64).sum()))

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Mean-pooled final hidden states (after the output norm), one per input, from a
        second context in embeddings mode (the weights are memory-mapped once)."""
        if self._embedder is None:
            with contextlib.redirect_stdout(_LogWriter()), contextlib.redirect_stderr(_LogWriter()):
                self._embedder = llama_cpp.Llama(
                    str(self.path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                    n_ctx=self.n_ctx, n_batch=self.n_ctx, n_ubatch=self.n_ctx, n_threads=self.threads,
                    n_threads_batch=self.threads, verbose=True)
            self._embedder.verbose = False
        emb, width, out = self._embedder, self._embedder.n_embd(), []
        for ids in inputs:
            emb._ctx.kv_cache_clear()
            emb._batch.reset()
            emb._batch.add_sequence(ids, 0, True)
            emb._ctx.decode(emb._batch)
            out.append(llama_cpp.llama_get_embeddings_seq(emb.ctx, 0)[:width])
        return out

    def score(self, prompt_ids, temperature, allowed, report):
        raise EngineError("field_not_honoured", "scoring is not available on llama.cpp", "logprobs")

    def compile_constraint(self, spec: dict):
        raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                          "response_format")

    def matcher(self, grammar):
        raise EngineError("field_not_honoured", "constrained decoding is not available on llama.cpp",
                          "response_format")

    def unload(self) -> None:
        for llm in (self.llm, self._embedder):
            if llm is not None:
                llm.close()


def _token_text(llm: llama_cpp.Llama, token_id) -> str:
    return "" if token_id is None else llm.detokenize([int(token_id)], special=True).decode("utf-8", errors="replace")


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
