"""The known-model catalogue: the short aliases /api/pull understands (spec: "Pull and
known-model discovery") → Hugging Face repositories greenroom can serve, with what is
known about each without asking the Hub. /api/models/known lists it and /api/search
filters it; both answer offline, so neither reports live Hub figures (downloads, likes).

`quant` names the one GGUF quantization an alias pulls from a repository that holds
many; `released` is the repository's first release (for sort=newest); the order of
CATALOGUE is its popularity rank (sort=popular). An alias resolving to a repository does
not mean the model was validated here: the `type: embedding` entries are BERT encoders,
which the transformers engine loads as embedding models (engines/transformers/encoder_engine.py;
all-minilm is also installed and served as `all-minilm:transformers` by the default config).
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Known:
    alias: str
    repo: str
    type: str  # llm | embedding
    format: str  # safetensors (transformers engine) | gguf (llama.cpp engine)
    family: str
    parameters: str
    quantization: str
    released: str  # YYYY-MM-DD
    quant: str | None = None  # GGUF: the file an alias pulls


CATALOGUE: tuple[Known, ...] = (
    Known(
        "llama3.2",
        "bartowski/Llama-3.2-3B-Instruct-GGUF",
        "llm",
        "gguf",
        "llama",
        "3.2B",
        "Q4_K_M",
        "2024-09-25",
        quant="Q4_K_M",
    ),
    Known(
        "tinyllama", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "llm", "safetensors", "llama", "1.1B", "BF16", "2023-12-30"
    ),
    Known(
        "mistral",
        "bartowski/Mistral-7B-Instruct-v0.3-GGUF",
        "llm",
        "gguf",
        "llama",
        "7.2B",
        "Q4_K_M",
        "2024-05-22",
        quant="Q4_K_M",
    ),
    Known("phi-3", "microsoft/Phi-3-mini-4k-instruct", "llm", "safetensors", "phi3", "3.8B", "BF16", "2024-04-23"),
    Known(
        "all-minilm",
        "sentence-transformers/all-MiniLM-L6-v2",
        "embedding",
        "safetensors",
        "bert",
        "23M",
        "F32",
        "2021-08-30",
    ),
    Known("bge-small", "BAAI/bge-small-en-v1.5", "embedding", "safetensors", "bert", "33M", "F32", "2023-09-12"),
)
BY_ALIAS = {k.alias: k for k in CATALOGUE}
TYPES = ("all", "llm", "embedding", "vision")
SORTS = ("popular", "newest", "downloads", "likes")


def row(k: Known) -> dict:
    return {
        "ollama_name": k.alias,
        "huggingface_repo": k.repo,
        "type": k.type,
        "format": k.format,
        "family": k.family,
        "parameter_size": k.parameters,
        "quantization": k.quantization,
        "released": k.released,
    }


def search(q: str, sort: str, type_: str, quantization: str) -> list[Known]:
    """Entries matching every filter: `q` (case-insensitive, in the alias, repository or
    family), `type_` (vision matches nothing: no entry is a vision model), `quantization`
    (exact, case-insensitive); ordered by `sort` (popular or newest)."""
    q, quantization = q.lower(), quantization.upper()
    found = [
        k
        for k in CATALOGUE
        if (not q or q in k.alias.lower() or q in k.repo.lower() or q in k.family.lower())
        and type_ in ("all", k.type)
        and (not quantization or k.quantization.upper() == quantization)
    ]
    if sort == "newest":
        found.sort(key=lambda k: k.released, reverse=True)
    return found
