"""Feature dashboards, computed on the model that serves: per feature of an attached SAE, its
top-activating contexts (each token's activation), a histogram of its activations, its density,
and the tokens its decoder direction promotes and suppresses through the unembedding (logit
effects: W_dec[i] · W_Uᵀ, no corpus needed). Pure compute, in small steps: the engine actor
(actors/dashboard_runner.py) runs one `DashboardJob.step()` at a time while it has nothing else to
do, so a request that arrives waits for one step at most.

What is read is the **unsteered** model (every forward inside `Steering.suppressed()`, as
scoring): a dashboard describes the feature, not today's steering. The corpus is cut into
contexts of `context_tokens` tokens, each fed as one sequence; its first position is an attention
sink with an outsized residual in real models (steering.median_norm leaves it out for the same
reason), so it is shown but never counted (top contexts, histogram, density).

`read_features` is the same reading for a few texts at once (feature search by text, contrast).
torch is imported where a job or a reading runs, not with the module: the front end reads its
defaults, and an engine actor imports it only once an SAE is read (as llama_steering.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from .base import EngineError, SamplingParams

if TYPE_CHECKING:
    import torch

# the default corpus: what the model itself writes after each of these (seeded sampling)
SEEDS = (
    "The history of Paris begins",
    "In the kitchen, my grandmother",
    "def fibonacci(n):\n",
    "The football match ended",
    "Dear Sir or Madam, I am writing",
    "The stock market fell sharply",
    "Photosynthesis is the process",
    "Once upon a time, in a small village",
    "The best way to learn a language",
    "hey lol did u see",
    "The French Revolution",
    "To install the package, run",
    "The weather in London today",
    "She opened the letter and",
    "Quantum mechanics describes",
    "The recipe calls for two cups of",
)
GENERATED_TOKENS = 96  # per seed
# the histogram's bins: log10 of an activation, from 10⁻³ to 10³ in quarter decades, with an
# underflow and an overflow bin at either end
HIST_LO, HIST_STEP, HIST_BINS = -3.0, 0.25, 24
HIST_EDGES = [round(10 ** (HIST_LO + HIST_STEP * i), 6) for i in range(HIST_BINS + 1)]
LOGIT_CHUNK = 64  # features whose logit effects one step computes


@attrs.frozen
class Corpus:
    """Where the contexts come from: the texts of `files` (.txt whole, .jsonl one text a line: a
    JSON string or an object's "text"), or, with no files, what the model writes after `seeds`."""

    files: tuple[str, ...] = ()
    seeds: tuple[str, ...] = SEEDS
    generated_tokens: int = GENERATED_TOKENS


def corpus_texts(files: tuple[str, ...]) -> list[str]:
    """The texts of the corpus files; EngineError naming the file and line that cannot be read."""
    texts = []
    for name in files:
        path = Path(name)
        try:
            raw = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EngineError(
                "invalid_parameter", f"corpus file {name} cannot be read: {exc}", "corpus.files"
            ) from None
        if path.suffix != ".jsonl":
            texts.append(raw)
            continue
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise EngineError(
                    "invalid_parameter",
                    f"corpus file {name} line {n} is neither a JSON string nor an object with a string 'text'",
                    "corpus.files",
                )
            texts.append(text)
    return texts


class _Capture:
    """An observer (steering.py's protocol) that keeps every position's activations of one SAE
    on an unsteered pass."""

    pre = True
    reads_suppressed = True

    def __init__(self, sae_id: str):
        self.sae_id = sae_id
        self.rows: list[torch.Tensor] = []

    def observe(self, sae, hidden: torch.Tensor) -> None:
        self.rows.append(sae.encode(hidden[0]).float().cpu())


def activations(engine, sae_id: str, ids: list[int]) -> torch.Tensor:
    """[positions, width]: SAE `sae_id`'s activations at every position of one unsteered pass
    over `ids` (the engine's scoring pass, which both engines read through)."""
    import torch

    capture = _Capture(sae_id)
    engine.score(ids, 1.0, None, 0, capture)
    if not capture.rows:
        raise EngineError("sae_not_attached", f"SAE {sae_id!r} is not attached to this model (any more)", "sae_id")
    return torch.cat(capture.rows)


@attrs.frozen
class TextRead:
    """One text read: its tokens, and per feature its mean over the positions after the first."""

    tokens: list[int]
    acts: torch.Tensor  # [positions, width]

    @property
    def mean(self) -> torch.Tensor:
        counted = self.acts[1:] if len(self.acts) > 1 else self.acts
        return counted.mean(dim=0)


def read_features(engine, sae_id: str, texts: list[str]) -> list[TextRead]:
    out = []
    for text in texts:
        ids = engine.tokenize(text)
        if not ids:
            raise EngineError("invalid_parameter", "a text has no tokens", "text")
        out.append(TextRead(ids, activations(engine, sae_id, ids)))
    return out


def logit_effects(w_dec: torch.Tensor, w_u: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Per decoder row, the k tokens it raises most and lowers most through the unembedding:
    (values, ids) of the top and of the bottom of W_dec · W_Uᵀ, in float32."""
    effects = w_dec.float() @ w_u.float().T
    up, down = effects.topk(k, dim=1), effects.topk(k, dim=1, largest=False)
    return up.values, up.indices, down.values, down.indices


class DashboardJob:
    """One dashboards job over `features` of SAE `sae_id`. `step()` does one unit of work — a
    block of logit effects, one decode step of the default corpus, one context's forward —
    and says whether there is more; `pause()` lets go of the engine (a generation's cache)
    when serving needs it. `logits` and `result()` hold what is done."""

    def __init__(
        self,
        engine,
        sae_id: str,
        features: list[int],
        corpus: Corpus,
        *,
        top_k: int,
        context_tokens: int,
        max_tokens: int,
        logit_k: int,
    ):
        import torch

        self.engine, self.sae_id, self.corpus = engine, sae_id, corpus
        self.features = torch.tensor(features, dtype=torch.long)
        self.top_k, self.context_tokens, self.max_tokens, self.logit_k = top_k, context_tokens, max_tokens, logit_k
        sae = engine.steering.sae(sae_id)
        self._w_dec = sae.W_dec[self.features.to(sae.W_dec.device)].float().cpu()
        self._logit_done = 0
        self.logits: list[dict] = []  # per feature, in order, as the logit steps make them
        n = len(features)
        self.tokens = 0  # positions counted
        self.contexts = 0
        self._active = torch.zeros(n, dtype=torch.long)
        self._hist = torch.zeros(n * (HIST_BINS + 2), dtype=torch.long)
        self._top = torch.full((n, top_k), -math.inf)
        self._top_ctx = torch.full((n, top_k), -1, dtype=torch.long)
        self._ctx_ids: list[list[int]] = []
        self._ctx_acts: dict[tuple[int, int], list[float]] = {}  # (feature row, context) → per-token activations
        self._pending: list[int] = []  # corpus token ids not yet cut into contexts
        self._texts = iter(corpus_texts(corpus.files)) if corpus.files else None
        self._texts_done = False
        self._seed = 0  # the default corpus: the seed being written, what it has so far, its open generation
        self._written: list[int] = []
        self._generation: Iterator | None = None

    @property
    def progress(self) -> dict:
        return {
            "logit_features": self._logit_done,
            "features": len(self.features),
            "tokens": self.tokens + self.contexts,  # every position fed (the first of each counted once)
            "max_tokens": self.max_tokens,
            "contexts": self.contexts,
        }

    def step(self) -> bool:
        if self._logit_done < len(self.features):
            self._logit_step()
            return True
        if self.tokens + self.contexts >= self.max_tokens:
            return False
        if len(self._pending) >= self.context_tokens or (self._pending and self._exhausted()):
            context, self._pending = self._pending[: self.context_tokens], self._pending[self.context_tokens :]
            if len(context) > 1:
                self._read(context)
            return True
        return self._more_text()

    def pause(self) -> None:
        if self._generation is not None:
            self._generation.close()
            self._generation = None

    # -- logit effects ----------------------------------------------------------------------

    def _logit_step(self) -> None:
        start, end = self._logit_done, min(self._logit_done + LOGIT_CHUNK, len(self.features))
        k = min(self.logit_k, self.engine.scoring_vocab)
        up, up_ids, down, down_ids = logit_effects(self._w_dec[start:end], self._unembedding(), k)
        text = self.engine.token_text
        for row in range(end - start):
            self.logits.append(
                {
                    "promoted": [_token(text, i, v) for i, v in zip(up_ids[row].tolist(), up[row].tolist())],
                    "suppressed": [_token(text, i, v) for i, v in zip(down_ids[row].tolist(), down[row].tolist())],
                }
            )
        self._logit_done = end

    def _unembedding(self) -> torch.Tensor:
        w_u = self.__dict__.get("_w_u")
        if w_u is None:
            w_u = self._w_u = self.engine.unembedding()[: self.engine.scoring_vocab].float().cpu()
        return w_u

    # -- the corpus --------------------------------------------------------------------------

    def _exhausted(self) -> bool:
        return self._texts_done if self._texts is not None else self._seed >= len(self.corpus.seeds)

    def _more_text(self) -> bool:
        """Feed the corpus one text (files) or one generated token (the default corpus); False
        once it has nothing more."""
        if self._texts is not None:
            text = None if self._texts_done else next(self._texts, None)
            if text is None:
                self._texts_done = True
                return bool(self._pending)
            self._pending += self.engine.tokenize(text, add_special_tokens=False)
            return True
        if self._seed >= len(self.corpus.seeds):
            return bool(self._pending)
        if self._generation is None:
            seed_ids = self.engine.tokenize(self.corpus.seeds[self._seed], add_special_tokens=False)
            if not self._written:
                self._written = list(seed_ids)
            left = self.corpus.generated_tokens - (len(self._written) - len(seed_ids))
            params = SamplingParams(max_tokens=left, temperature=0.8, top_p=0.95, seed=self._seed)
            self._generation = self.engine.generate_ids(list(self._written), params)
        with self.engine.steering.suppressed():
            token = next(self._generation, None)
        done = token is None or token[0] in self.engine.eos_token_ids
        if not done:
            self._written.append(token[0])
        seed_ids = self.engine.tokenize(self.corpus.seeds[self._seed], add_special_tokens=False)
        if done or len(self._written) - len(seed_ids) >= self.corpus.generated_tokens:
            self.pause()
            self._pending += self._written
            self._written, self._seed = [], self._seed + 1
        return True

    # -- reading a context ---------------------------------------------------------------

    def _read(self, ids: list[int]) -> None:
        import torch

        acts = activations(self.engine, self.sae_id, ids)[:, self.features]  # [T, F]
        context = len(self._ctx_ids)
        self._ctx_ids.append(ids)
        self.contexts += 1
        counted = acts[1:]
        self.tokens += len(counted)
        fired = counted > 0
        self._active += fired.sum(dim=0)
        rows, cols = fired.nonzero(as_tuple=True)
        values = counted[rows, cols]
        bins = ((values.log10() - HIST_LO) / HIST_STEP).floor().clamp(-1, HIST_BINS).long() + 1
        self._hist.index_add_(0, cols * (HIST_BINS + 2) + bins, torch.ones_like(bins))
        peak = counted.max(dim=0).values
        merged = torch.cat([self._top, peak[:, None]], dim=1)
        refs = torch.cat([self._top_ctx, torch.full((len(peak), 1), context, dtype=torch.long)], dim=1)
        self._top, order = merged.topk(self.top_k, dim=1)
        self._top_ctx = refs.gather(1, order)
        entered = ((self._top_ctx == context).any(dim=1) & (peak > 0)).nonzero(as_tuple=True)[0]
        for row in entered.tolist():
            self._ctx_acts[(row, context)] = [round(v, 5) for v in acts[:, row].tolist()]
        if context % 64 == 63:
            self._prune()

    def _prune(self) -> None:
        kept = {(row, c) for row, refs in enumerate(self._top_ctx.tolist()) for c in refs if (row, c) in self._ctx_acts}
        self._ctx_acts = {key: self._ctx_acts[key] for key in kept}

    def result(self) -> list[dict]:
        """Per feature, in order: its corpus statistics (what the corpus steps read)."""
        text = self.engine.token_text
        out = []
        hist = self._hist.view(len(self.features), HIST_BINS + 2)
        for row, index in enumerate(self.features.tolist()):
            contexts = []
            for value, c in zip(self._top[row].tolist(), self._top_ctx[row].tolist()):
                acts = self._ctx_acts.get((row, c))
                if c < 0 or acts is None or value <= 0:
                    continue
                ids = self._ctx_ids[c]
                contexts.append(
                    {
                        "max": value,
                        "max_position": max(range(1, len(acts)), key=acts.__getitem__),
                        "tokens": [{"id": i, "text": text(i), "activation": a} for i, a in zip(ids, acts)],
                    }
                )
            active = int(self._active[row])
            out.append(
                {
                    "index": index,
                    "tokens": self.tokens,
                    "density": active / self.tokens if self.tokens else 0.0,
                    "histogram": {"edges": HIST_EDGES, "counts": hist[row].tolist()},
                    "contexts": contexts,
                }
            )
        return out


def _token(text, token_id: int, value: float) -> dict:
    return {"id": token_id, "text": text(token_id), "value": value}
