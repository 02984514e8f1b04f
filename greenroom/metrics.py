"""Prometheus metrics of one server (prometheus-client), exposed at GET /metrics.

Token timing is observed in one place every surface goes through — the front end's
end of an engine stream (supervisor/engine_client.py) — so OpenAI, Ollama and Needle
requests are measured alike. Requests are counted by the app's after-request hook.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "greenroom_requests", "HTTP requests by route, method and status", ("route", "method", "status"), registry=REGISTRY
)
TOKENS = Counter("greenroom_tokens_generated", "Tokens generated, by model", ("model",), registry=REGISTRY)
TTFT = Histogram(
    "greenroom_time_to_first_token_seconds",
    "From a request's submission to its first token",
    ("model",),
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INTER_TOKEN = Histogram(
    "greenroom_inter_token_seconds",
    "Time per token after the first",
    ("model",),
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
QUEUE_DEPTH = Gauge(
    "greenroom_queue_depth", "Requests queued or running in an engine actor", ("actor",), registry=REGISTRY
)
MODEL_EVENTS = Counter(
    "greenroom_model_events",
    "Model loads and unloads after start-up; evicted: unloaded to make room for another (a swap)",
    ("model", "event"),
    registry=REGISTRY,
)
SWAP_WAITS = Counter(
    "greenroom_swap_waits",
    "Loads that waited for a model with requests running to finish before unloading it for room",
    ("device",),
    registry=REGISTRY,
)
ACTOR_EVENTS = Counter(
    "greenroom_actor_events",
    "Actor lifecycle: started (models loaded), stopped (unloaded), failed",
    ("actor", "event"),
    registry=REGISTRY,
)


# automatic prefix reuse per model (engines/transformers/prefix_cache.py; llama.cpp: its RAM prompt store,
# engines/llama_cpp/prompt_store.py), as its engine actor's status reports it
PREFIX_CACHE = {
    figure: Gauge(f"greenroom_prefix_cache_{figure}", doc, ("actor", "model"), registry=REGISTRY)
    for figure, doc in {
        "max_bytes": "The prefix tree's bound, in bytes of KV (prefix_cache_tokens, or sized from memory)",
        "max_tokens": "The prefix tree's bound, in KV tokens",
        "tokens": "KV tokens held for prefix reuse",
        "bytes": "Bytes of KV held for prefix reuse",
        "entries": "Nodes of the prefix tree (runs of blocks whose KV is held once)",
        "hits": "Prompts that reused a stored prefix, since the model loaded",
        "misses": "Prompts that found no stored prefix, since the model loaded",
        "reused_tokens": "Prompt tokens not prefilled thanks to a stored prefix, since the model loaded",
        "restored": "Prompts whose prefix was copied back from host RAM (llama.cpp), since the model loaded",
    }.items()
}


def engine_status(actor: str, status: dict | None) -> None:
    """The gauges read from an engine actor's status (each /api/actors or /metrics read)."""
    for model, figures in ((status or {}).get("prefix_cache") or {}).items():
        for figure, value in figures.items():
            PREFIX_CACHE[figure].labels(actor, model).set(value)


def count_request(rule: str, method: str, status: int) -> None:
    """One HTTP request answered (the app's after-request hook)."""
    child = _REQUESTS.get((rule, method, status))
    if child is None:
        child = _REQUESTS[rule, method, status] = REQUESTS.labels(rule, method, str(status))
    child.inc()


# each label set's child, looked up once: `labels()` is a lock, a tuple of str() and a dict lookup
# per call, and a child is never removed (a series is exported for the process's lifetime)
_REQUESTS: dict[tuple[str, str, int], Counter] = {}
_CLOCKS: dict[str, tuple[Histogram, Histogram, Counter]] = {}


class TokenClock:
    """Per request: observes the first token's latency, then the time per later token."""

    def __init__(self, model: str):
        self._start = self._last = time.monotonic()
        self._tokens = 0
        children = _CLOCKS.get(model)
        if children is None:
            children = _CLOCKS[model] = (TTFT.labels(model), INTER_TOKEN.labels(model), TOKENS.labels(model))
        self._ttft, self._inter_token, self._count = children

    def text(self, completion_tokens: int) -> None:
        now = time.monotonic()
        if self._tokens == 0:
            self._ttft.observe(now - self._start)
        elif completion_tokens > self._tokens:
            self._inter_token.observe((now - self._last) / (completion_tokens - self._tokens))
        if completion_tokens > self._tokens:
            self._count.inc(completion_tokens - self._tokens)
            self._tokens, self._last = completion_tokens, now


def render() -> tuple[bytes, str]:
    """The exposition and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
