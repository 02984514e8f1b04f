"""The OpenVINO engine for an embedding model: an encoder's IR directory (what
encoder_export.py writes from a sentence-transformers checkpoint, or optimum-cli's
feature-extraction export) served by TextEmbeddingPipeline alone, on the CPU or through the
NPU's static-shape profile (text_embedding.py). It embeds and tokenises; it generates
nothing, scores nothing and has no chat template, and says so when asked.

Its window is the longest input the model was trained to embed (sentence_bert_config.json's
max_seq_length, else its position table), and on the NPU the profile's row length, which
is that window unless the placement's max_prompt_len sets it (within the position table)."""

from __future__ import annotations

from pathlib import Path

import openvino as ov
import openvino_genai as ov_genai

from ..base import EngineError, ModelInfo
from ..capabilities import EMBEDDING_MODEL
from ..loader import checkpoint_json
from ..text.pooling import max_seq_length, read_pooling
from .openvino_engine import OpenVINOText, Plugin, _file_bytes, _weights
from .text_embedding import TextEmbedder


def is_encoder_ir(path: Path) -> bool:
    """An IR directory whose model ends at last_hidden_state (no `logits`): an embedding model."""
    graph = Path(path) / "openvino_model.xml"
    if not graph.is_file():
        return False
    names = {name for output in ov.Core().read_model(graph).outputs for name in output.get_names()}
    return "last_hidden_state" in names and "logits" not in names


class OpenVINOEncoder(OpenVINOText):
    capabilities = EMBEDDING_MODEL
    eos_token_ids: frozenset[int] = frozenset()
    has_chat_template = False
    chat = None
    scoring_vocab = 0  # no output rows: nothing is scored

    def __init__(
        self,
        model_id: str,
        path: str | Path,
        device: str = "cpu",
        dtype: str | None = None,
        threads: int | None = None,
        max_prompt_len: int | None = None,
    ):
        """As OpenVINOEngine's arguments; `max_prompt_len` sets the NPU profile's tokens per row."""
        self.path = Path(path)
        self.model_id = model_id
        plugin = Plugin.of(device, dtype, threads)
        self.device, self.npu = plugin.device, plugin.npu
        positions = checkpoint_json(self.path).get("max_position_embeddings")
        if not isinstance(positions, int) or positions <= 0:
            raise ValueError(f"{self.path}/config.json gives no max_position_embeddings")
        trained = min(max_seq_length(self.path) or positions, positions)
        # never past the position table, whatever the placement asks
        self.context_length = min(max_prompt_len or trained, positions) if self.npu else trained
        self.tokenizer = ov_genai.Tokenizer(self.path)
        self.vocab_size = len(self.tokenizer.get_vocab_vector())
        self.embedder = TextEmbedder(
            self.path,
            self.device,
            plugin.embedding_properties,
            read_pooling(self.path),
            self.context_length if self.npu else None,
        )
        parameters, quantization = _weights(ov.Core().read_model(self.path / "openvino_model.xml"))
        self.info = ModelInfo(
            id=model_id,
            engine="openvino",
            context_length=self.context_length,
            dtype=plugin.precision or "unrecorded",
            device=plugin.computes_on,
            parameters=parameters,
            quantization=quantization,
            footprint_bytes=_file_bytes(self.path / "openvino_model.bin"),
            embedding_only=True,
        )

    def embed_texts(self, texts: list[str]) -> list[list[float]]:
        """Pooled and normalised as the model's sentence-transformers modules say."""
        return self.embedder.embed(texts)

    def _refuse(self, what: str, param: str):
        """In Ollama's words for an embedding model (the front end refuses most before this)."""
        return EngineError("field_not_honoured", f'"{self.model_id}" does not support {what}', param)

    def render_chat(self, messages, template_kwargs=None, tools=None, generation_prompt=True):
        raise self._refuse("chat", "messages")

    def generate_ids(self, prompt_ids, params, matcher=None):
        raise self._refuse("generate", "model")

    def score(self, prompt_ids, temperature, allowed, report, readout=None):
        raise self._refuse("scoring", "logprobs")

    def prompt_logprobs(self, prompt_ids, temperature, report, allowed=None, next_report=None, readout=None):
        raise self._refuse("scoring", "logprobs")

    def compile_constraint(self, spec):
        raise self._refuse("constrained decoding", "response_format")

    def matcher(self, grammar):
        raise self._refuse("constrained decoding", "response_format")

    def unload(self) -> None:
        self.embedder.close()
        del self.tokenizer
