"""An embedding model on the transformers engine: a BERT-family encoder (a sentence-transformers
checkpoint such as all-MiniLM-L6-v2) loaded with AutoModel, which pools one vector per input
as the checkpoint's own modules say (engines/text/pooling.py), in padded batches
(pooled_batches.py), and generates nothing — the front end refuses chat and generation on it
before it is asked (engines/embedding_models.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from ..base import EngineError, ModelInfo, default_cpu_threads
from ..capabilities import EMBEDDING_MODEL
from ..text.pooling import Pooling, max_seq_length, read_pooling
from .pooled_batches import embed_batched


class EncoderEngine:
    capabilities = EMBEDDING_MODEL
    has_chat_template = False
    eos_token_ids: frozenset[int] = frozenset()

    def __init__(
        self, model_id: str, path: str | Path, device: str = "cpu", dtype: str | None = None, threads: int | None = None
    ):
        path = Path(path)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(threads or default_cpu_threads())
        # float32 everywhere unless asked: the model is small, and a sentence vector compared by
        # cosine wants its digits (the reference it is tested against is float32)
        torch_dtype = getattr(torch, dtype) if dtype else torch.float32
        try:
            self.pooling: Pooling = read_pooling(path)
        except ValueError as exc:
            raise EngineError("model_load_failed", str(exc), "model") from None
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch_dtype).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        cfg = self.model.config
        self.vocab_size = cfg.vocab_size
        self.scoring_vocab = min(cfg.vocab_size, len(self.tokenizer))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        positions = int(getattr(cfg, "max_position_embeddings", 0) or self.tokenizer.model_max_length)
        self.info = ModelInfo(
            id=model_id,
            engine="transformers",
            # the length it was trained for, where the checkpoint says (all-MiniLM-L6-v2: 256 of 512 positions)
            context_length=min(max_seq_length(path) or positions, positions),
            dtype=str(torch_dtype).removeprefix("torch."),
            device=str(self.device),
            parameters=sum(p.numel() for p in self.model.parameters()),
            footprint_bytes=sum(t.nbytes for t in (*self.model.parameters(), *self.model.buffers())),
            embedding_only=True,
        )

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled vector per tokenised input, in the inputs' order, in padded batches."""
        with torch.inference_mode():
            return embed_batched(
                lambda ids, mask: self.model(input_ids=ids, attention_mask=mask).last_hidden_state,
                inputs,
                self.pooling,
                self.pad_id,
                self.device,
            )

    def unload(self) -> None:
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
