"""The OpenVINO GenAI engine: an OpenVINO model directory (an optimum-intel export, a
`*-ov` Hub repository, or the demo IR of demo_openvino.py) through `LLMPipeline`, on the
CPU or through the NPU pipeline.

`LLMPipeline.generate` runs its own decode loop and reports each token to a streamer. The
engine runs it in a helper thread and steps it in lockstep with `generate_ids`: the
streamer hands a token over and waits until the caller asks for the next one, so a token
is computed only when it is wanted, and closing the iterator answers the waiting streamer
with CANCEL — generation ends at that token and the pipeline is free again once the
iterator is closed. The pipeline never stops on its own before max_new_tokens (EOS and
stop tokens are generation.py's to see), so every sequence ends with a finish reason.

The NPU pipeline compiles static shapes: prompts up to MAX_PROMPT_LEN tokens, a KV cache
of MAX_PROMPT_LEN + MIN_RESPONSE_LEN. On a machine without an NPU it runs on the CPU
(NPUW_DEVICES=CPU), which is how this code path is tested.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import openvino as ov
import openvino_genai as ov_genai

from ..base import (
    GREEDY_BELOW,
    Constraint,
    EngineError,
    ModelInfo,
    SamplingParams,
    context_length_exceeded,
    default_cpu_threads,
)
from ..capabilities import ENGINES
from ..loader import checkpoint_json
from ..text.chat import ChatTemplate
from ..text.pooling import read_pooling
from .text_embedding import TextEmbedder, texts_of, token_rows

# where a model directory keeps its feature-extraction graph (demo_openvino.py writes one)
EMBEDDING_SUBDIR = "embedding"
# the NPU pipeline's static shapes when the placement names none (openvino-genai's defaults)
MAX_PROMPT_LEN = 1024
MIN_RESPONSE_LEN = 128
# the NPU plugin with no NPU present: its partitioning layer (NPUW) compiles every part for
# the CPU, and the online partitioner is off (it expects an NPU to measure)
NPU_ON_CPU = {"NPUW_DEVICES": "CPU", "NPUW_ONLINE_PIPELINE": "NONE"}
_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_DTYPE = {v: k for k, v in _PRECISION.items()}
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def openvino_device(device: str) -> tuple[str, bool]:
    """greenroom's device string → (OpenVINO device, whether it is the NPU pipeline).
    "cpu" → CPU; "npu" / "npu:<n>" → the n-th NPU OpenVINO sees (NPU, NPU.1, …), or, with
    none present, the NPU pipeline on the CPU."""
    kind, _, index = device.lower().partition(":")
    if kind == "cpu" and not index:
        return "CPU", False
    if kind == "npu" and (not index or index.isdigit()):
        npus = [d for d in ov.Core().available_devices if d.startswith("NPU")]
        n = int(index or 0)
        if not npus:
            return "NPU", True
        if n >= len(npus):
            raise ValueError(f"device {device!r}: OpenVINO sees {len(npus)} NPU(s): {npus}")
        return npus[n], True
    raise ValueError(f"the OpenVINO engine runs on 'cpu' or 'npu[:<n>]', not {device!r}")


@attrs.frozen
class Plugin:
    """Where an OpenVINO model computes, and the properties each of its pipelines compiles with."""

    device: str  # OpenVINO's: CPU, NPU, NPU.1, …
    npu: bool  # the NPU pipeline (static shapes)
    computes_on: str  # the device that computes: CPU for the NPU pipeline with no NPU present
    precision: str | None  # the inference precision (float32, bfloat16, float16) as greenroom names it
    properties: dict  # precision and CPU threads: what every pipeline of the model is given
    embedding_properties: dict  # what TextEmbeddingPipeline is given besides

    @classmethod
    def of(cls, device: str, dtype: str | None, threads: int | None) -> Plugin:
        """`dtype` sets the inference precision; None keeps the device's default (bf16 on a CPU
        with AVX-512 BF16 or AMX). `threads`: the CPU device's inference threads."""
        ov_device, npu = openvino_device(device)
        core = ov.Core()
        computes_on = "CPU" if npu and ov_device not in core.available_devices else ov_device
        properties: dict = {}
        if dtype is not None:
            if dtype not in _PRECISION:
                raise ValueError(f"the OpenVINO engine computes in {sorted(_PRECISION)}, not {dtype!r}")
            properties["INFERENCE_PRECISION_HINT"] = _PRECISION[dtype]
        if ov_device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = threads or default_cpu_threads()
        embedding = dict(properties)
        if npu and computes_on == "CPU":
            embedding.update(NPU_ON_CPU, NPU_USE_NPUW="YES")
        precision = dtype or _DTYPE.get(core.get_property(computes_on, "INFERENCE_PRECISION_HINT").get_type_name())
        return cls(ov_device, npu, computes_on, precision, properties, embedding)


class OpenVINOText:
    """What both OpenVINO engines do with text alike, through openvino-genai's Tokenizer
    (`self.tokenizer`): tokenising, decoding, and embedding token arrays as the texts they are
    (the pipeline embeds text: `embed_texts`)."""

    tokenizer: ov_genai.Tokenizer

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).input_ids.data[0].tolist()

    def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        return token_rows(self.tokenizer, texts)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        return self.embed_texts(texts_of(self, inputs))  # each engine's embed_texts


class OpenVINOEngine(OpenVINOText):
    capabilities = ENGINES["openvino"]

    def __init__(
        self,
        model_id: str,
        path: str | Path,
        device: str = "cpu",
        dtype: str | None = None,
        threads: int | None = None,
        max_prompt_len: int | None = None,
        min_response_len: int | None = None,
        compile_cache: str | Path | None = None,
        chat_template: str | None = None,
    ):
        """`dtype` sets the inference precision (float32, bfloat16, float16); None keeps the
        device's default (bf16 on a CPU with AVX-512 BF16 or AMX). `threads`: the CPU
        device's inference threads. `max_prompt_len` and `min_response_len` size the NPU
        pipeline; `compile_cache` keeps its compiled blobs."""
        self.path = Path(path)
        plugin = Plugin.of(device, dtype, threads)
        self.device, self.npu = plugin.device, plugin.npu
        config = checkpoint_json(self.path)
        trained = next((int(config[k]) for k in _CONTEXT_KEYS if config.get(k)), None)
        properties = dict(plugin.properties)
        self.max_prompt_len = None
        if self.npu:
            self.max_prompt_len = max_prompt_len or MAX_PROMPT_LEN
            response = min_response_len or MIN_RESPONSE_LEN
            properties.update(MAX_PROMPT_LEN=self.max_prompt_len, MIN_RESPONSE_LEN=response)
            if compile_cache is not None:
                properties["CACHE_DIR"] = str(compile_cache)
            if plugin.computes_on == "CPU":
                properties.update(NPU_ON_CPU)
            # the KV cache holds exactly this many tokens (measured: prompt + generated)
            window = self.max_prompt_len + response
            self.context_length = min(window, trained or window)
        elif trained is None:
            raise ValueError(f"{self.path}/config.json gives no context length ({', '.join(_CONTEXT_KEYS)})")
        else:
            self.context_length = trained
        self.pipe = ov_genai.LLMPipeline(self.path, self.device, **properties)
        self.tokenizer = self.pipe.get_tokenizer()
        self._plugin = plugin
        self._embedder: TextEmbedder | None = None  # made on first use

        gen = self.pipe.get_generation_config()
        self.eos_token_ids = frozenset(int(t) for t in {gen.eos_token_id, *gen.stop_token_ids} if t >= 0)
        if chat_template:  # the config's, over the model's own
            self.tokenizer.set_chat_template(chat_template)
        self.has_chat_template = bool(self.tokenizer.chat_template)
        self.chat = (
            ChatTemplate(
                lambda msgs, gen, tools, kwargs: self.tokenizer.apply_chat_template(
                    msgs, gen, tools=tools, extra_context=kwargs or None
                )
            )
            if self.has_chat_template
            else None
        )
        graph = ov.Core().read_model(self.path / "openvino_model.xml")  # maps the weights; nothing is copied
        self.vocab_size = self.scoring_vocab = graph.output("logits").get_partial_shape()[-1].get_length()
        parameters, quantization = _weights(graph)
        self.info = ModelInfo(
            id=model_id,
            engine="openvino",
            context_length=self.context_length,
            dtype=plugin.precision or "unrecorded",
            device=plugin.computes_on,
            parameters=parameters,
            revision=_revision(self.path),
            quantization=quantization,
            # the weights the pipeline maps (what it compiles beside them only the measured load shows)
            footprint_bytes=_file_bytes(self.path / "openvino_model.bin"),
        )

    def render_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
        generation_prompt: bool = True,
    ) -> list[int]:
        """The model's own template, rendered by openvino-genai; `template_kwargs` are its
        variables. The rendered text carries the template's own BOS."""
        text = self.chat.render(messages, tools, template_kwargs, generation_prompt)
        return self.tokenize(text, add_special_tokens=False)

    def generate_ids(self, prompt_ids: list[int], params: SamplingParams, matcher=None) -> Iterator[tuple[int, float]]:
        """(token id, 0.0) per step: LLMPipeline reports no per-token log-probabilities."""
        if matcher is not None:  # the ledger refuses response_format and tools before this
            raise EngineError(
                "field_not_honoured", "constrained decoding is not available on OpenVINO", "response_format"
            )
        self._check_prompt(len(prompt_ids))
        config = self._generation_config(params, len(prompt_ids))
        inputs = ov_genai.TokenizedInputs(
            ov.Tensor(np.array([prompt_ids], dtype=np.int64)), ov.Tensor(np.ones((1, len(prompt_ids)), dtype=np.int64))
        )
        steps = _Lockstep()
        worker = threading.Thread(
            target=steps.run, args=(self.pipe, inputs, config), name="openvino-generate", daemon=True
        )
        worker.start()
        try:
            while (tokens := steps.next_tokens()) is not None:
                for token in tokens:
                    yield token, 0.0, ()  # the pipeline reports no probabilities (capabilities)
        finally:
            steps.cancel()
            worker.join()

    def _check_prompt(self, n: int) -> None:
        if self.max_prompt_len is not None and n > self.max_prompt_len:
            raise context_length_exceeded(
                self.max_prompt_len,
                f"your prompt has {n} tokens",
                "prompt",
                "prompt",
                window="prompt length on the NPU",
                setting="MAX_PROMPT_LEN",
            )

    def _generation_config(self, params: SamplingParams, prompt_len: int) -> ov_genai.GenerationConfig:
        config = self.pipe.get_generation_config()
        # the caller resolves max_tokens; without one, the room the window leaves
        config.max_new_tokens = params.max_tokens if params.max_tokens is not None else self.context_length - prompt_len
        config.ignore_eos = True
        config.stop_token_ids = set()
        config.repetition_penalty = params.repetition_penalty
        config.do_sample = params.temperature >= GREEDY_BELOW
        if config.do_sample:
            config.temperature = params.temperature
            config.top_p = params.top_p
            if params.top_k > 0:
                config.top_k = params.top_k
            # `seed` would be ignored silently; an unseeded request must not repeat the last one
            config.rng_seed = params.seed if params.seed is not None else random.getrandbits(32)
        return config

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        """Final hidden states from the directory's `embedding/` graph, pooled as the model
        says (a causal LM: the mean, not normalised) by TextEmbeddingPipeline, BATCH texts a
        call; on the NPU its static-shape profile, MAX_PROMPT_LEN tokens a row."""
        if self._embedder is None:
            embedding_dir = self.path / EMBEDDING_SUBDIR
            if not (embedding_dir / "openvino_model.xml").exists():
                raise EngineError(
                    "field_not_honoured",
                    (
                        f"this OpenVINO model has no embedding graph ({EMBEDDING_SUBDIR}/openvino_model.xml), "
                        f"so it serves no embeddings"
                    ),
                    "model",
                )
            self._embedder = TextEmbedder(
                embedding_dir,
                self.device,
                self._plugin.embedding_properties,
                read_pooling(self.path),
                self.max_prompt_len,
            )
        return self._embedder.embed(texts)

    def score(self, prompt_ids, temperature, allowed, report, readout=None):
        raise EngineError("field_not_honoured", "scoring is not available on OpenVINO", "logprobs")

    def compile_constraint(self, spec: Constraint):
        raise EngineError("field_not_honoured", "constrained decoding is not available on OpenVINO", "response_format")

    def matcher(self, grammar):
        raise EngineError("field_not_honoured", "constrained decoding is not available on OpenVINO", "response_format")

    def unload(self) -> None:
        del self.pipe, self.tokenizer
        if self._embedder is not None:
            self._embedder.close()
        self._embedder = None


class _Lockstep(ov_genai.StreamerBase):
    """A streamer that hands each token to the consuming thread and waits for its answer:
    RUNNING when the next token is wanted, CANCEL when the consumer is gone."""

    _DONE = object()

    def __init__(self):
        super().__init__()
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting = False  # the streamer holds a token's answer open
        self._cancelled = False

    def run(self, pipe, inputs, config) -> None:
        try:
            pipe.generate(inputs, config, self)
            self._tokens.put(self._DONE)
        except BaseException as exc:  # noqa: BLE001 — re-raised in the consuming thread
            self._tokens.put(exc)

    def write(self, token) -> ov_genai.StreamingStatus:
        if self._cancelled:  # the consumer is gone: nothing waits for another token
            return ov_genai.StreamingStatus.CANCEL
        self._tokens.put(token if isinstance(token, list) else [token])
        return self._answers.get()

    def end(self) -> None:
        """Required of a streamer; the end is seen when generate returns (run)."""

    def next_tokens(self) -> list[int] | None:
        """The next step's tokens, after answering the previous step's; None at the end."""
        if self._waiting:
            self._answers.put(ov_genai.StreamingStatus.RUNNING)
        item = self._tokens.get()
        if isinstance(item, BaseException):
            self._waiting = False
            raise item
        self._waiting = item is not self._DONE
        return None if item is self._DONE else item

    def cancel(self) -> None:
        self._cancelled = True
        if self._waiting:
            self._waiting = False
            self._answers.put(ov_genai.StreamingStatus.CANCEL)


def _revision(path: Path) -> str | None:
    """A Hugging Face cache snapshot's commit, or the demo generator's version and seed (as
    the transformers engine names them); None (written "unrecorded") otherwise."""
    if path.parent.name == "snapshots":
        return path.name[:8]
    marker = checkpoint_json(path, "greenroom.json")
    return f"demo-{marker['size']}-v{marker['generator_version']}-s{marker['seed']}" if marker else None


def _weights(graph: ov.Model) -> tuple[int, str | None]:
    """(parameters, storage type) from the IR's weight constants — floating or low-bit
    integer, shape constants aside — the type being the one most weight elements are
    stored in (F32, F16, U8, U4, …)."""
    counts: dict[str, int] = {}
    for op in graph.get_ops():
        if op.get_type_name() != "Constant":
            continue
        kind = op.get_output_element_type(0)
        if kind in (ov.Type.i64, ov.Type.i32, ov.Type.boolean):
            continue
        size = int(np.prod(op.get_output_shape(0), dtype=np.int64))
        if size > 1:  # scalars are the graph's arithmetic (eps, scales), not weights
            name = kind.get_type_name().upper()
            counts[name] = counts.get(name, 0) + size
    return sum(counts.values()), (max(counts, key=counts.get) if counts else None)


def _file_bytes(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
