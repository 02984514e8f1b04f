"""Sentence embeddings through openvino-genai's TextEmbeddingPipeline, pooled and normalised
as the model says (engines/text/pooling.py), for both OpenVINO engines: a causal LM's
`embedding/` graph (openvino_engine.py) and an encoder such as all-MiniLM-L6-v2
(openvino_encoder.py).

The pipeline embeds texts. On the CPU device its shapes are dynamic: each call pads a batch
to its longest text. The NPU compiles static shapes only, so there the pipeline runs the
static-shape profile — `max_length` tokens per row, every row padded to it
(`pad_to_max_length`), `batch_size` rows per call — and a request's texts go BATCH at a time,
the last batch filled up with copies of its last text (their vectors dropped); a single text
runs in a one-row shape of its own, so a lone query does not pay for BATCH rows. Each shape
is compiled on its first use."""

from __future__ import annotations

from pathlib import Path

import openvino_genai as ov_genai

from ..base import EngineError
from ..text.pooling import Pooling

# texts per pipeline call: the NPU's static batch, and on the CPU a bound on one call's
# activations (a call pads its texts to the longest)
BATCH = 8
_POOLING_TYPES = {
    "mean": ov_genai.TextEmbeddingPipeline.PoolingType.MEAN,
    "cls": ov_genai.TextEmbeddingPipeline.PoolingType.CLS,
    "lasttoken": ov_genai.TextEmbeddingPipeline.PoolingType.LAST_TOKEN,
}


class TextEmbedder:
    def __init__(
        self, model_dir: Path, device: str, properties: dict, pooling: Pooling, static_length: int | None = None
    ):
        """`model_dir`: an IR directory with last_hidden_state as its output and the tokenizer's
        IR beside it; `static_length`: the NPU profile's tokens per row (None: dynamic shapes).
        ValueError for a pooling the pipeline has not (max)."""
        if pooling.mode not in _POOLING_TYPES:
            raise ValueError(f"TextEmbeddingPipeline pools by {sorted(_POOLING_TYPES)}, not {pooling.mode!r}")
        self.model_dir, self.device, self.properties = Path(model_dir), device, dict(properties)
        self.pooling, self.static_length = pooling, static_length
        self._pipelines: dict[int | None, ov_genai.TextEmbeddingPipeline] = {}  # by static batch size

    def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order, BATCH texts per pipeline call."""
        vectors = []
        for start, stop, rows in calls(len(texts), self.static_length is not None):
            chunk = texts[start:stop]
            filled = chunk + chunk[-1:] * ((rows or len(chunk)) - len(chunk))  # copies of its last text
            vectors += self._pipeline(rows).embed_documents(filled)[: len(chunk)]
        return [list(v) for v in vectors]

    def _pipeline(self, batch: int | None) -> ov_genai.TextEmbeddingPipeline:
        if batch not in self._pipelines:
            config = ov_genai.TextEmbeddingPipeline.Config()
            config.pooling_type = _POOLING_TYPES[self.pooling.mode]
            config.normalize = self.pooling.normalize
            if batch is not None:  # the static-shape profile
                config.max_length, config.pad_to_max_length, config.batch_size = self.static_length, True, batch
            self._pipelines[batch] = ov_genai.TextEmbeddingPipeline(
                self.model_dir, self.device, config, **self.properties
            )
        return self._pipelines[batch]

    def close(self) -> None:
        self._pipelines.clear()


def calls(count: int, static: bool) -> list[tuple[int, int, int | None]]:
    """The pipeline calls that embed `count` texts: (start, stop, rows) for texts[start:stop],
    `rows` the static shape's batch size that call runs in (None: dynamic shapes) — BATCH texts
    a call, a lone text in a one-row shape of its own."""
    if static and count == 1:
        return [(0, 1, 1)]
    return [(start, min(start + BATCH, count), BATCH if static else None) for start in range(0, count, BATCH)]


def token_rows(tokenizer: ov_genai.Tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's ids (special tokens added), the texts tokenised in one call: its rows come
    padded, and a row's ids are those its attention mask keeps (either padding side)."""
    encoded = tokenizer.encode(texts)
    ids, mask = encoded.input_ids.data, encoded.attention_mask.data.astype(bool)
    return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]


def texts_of(engine, inputs: list[list[int]]) -> list[str]:
    """Each token array as the text that tokenises back to it, the pipeline embedding text:
    a token array that is no text's tokenisation (a special token inside it, pieces of
    words) is refused. Text inputs skip this (the engines' embed_texts)."""
    texts = []
    for ids in inputs:
        text = engine.decode(ids)
        if engine.tokenize(text) != ids:
            raise EngineError(
                "invalid_parameter",
                "OpenVINO embeds text: this token array does not decode to a text that tokenises back to it",
                "input",
            )
        texts.append(text)
    return texts
