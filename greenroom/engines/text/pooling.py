"""How a sentence embedding is pooled from token states, as the model itself says: a
sentence-transformers checkpoint's modules.json names its Pooling module (whose config.json
picks CLS, mean, max or last-token pooling) and whether a Normalize module follows. Every
engine reads its model's pooling here; a checkpoint without modules.json (a causal LM) pools
by the spec's rule, the mean over the input's tokens, not normalised. `max_seq_length` reads
the longest input the checkpoint was trained for (sentence_bert_config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

MODES = ("mean", "cls", "max", "lasttoken")

# 1_Pooling/config.json's keys, in sentence-transformers' order of precedence
_MODE_KEYS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_lasttoken", "lasttoken"),
)


@attrs.frozen
class Pooling:
    mode: str = "mean"  # one of MODES
    normalize: bool = False  # unit length, as a Normalize module makes it
    sentence_transformers: bool = False  # read from modules.json (an embedding model), not the default


MEAN = Pooling()


def read_pooling(checkpoint: Path) -> Pooling:
    """The pooling of the checkpoint folder `checkpoint`; MEAN when it has no modules.json.
    ValueError for a modules.json this cannot honour (sqrt-length or weighted pooling, two
    pooling modes at once, a Pooling module without its config)."""
    checkpoint = Path(checkpoint)
    try:
        modules = json.loads((checkpoint / "modules.json").read_text())
    except FileNotFoundError:
        return MEAN
    except (OSError, ValueError) as exc:
        raise ValueError(f"{checkpoint}/modules.json is unreadable: {exc}") from None
    types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    normalize = "Normalize" in types
    if "Pooling" not in types:
        return Pooling("mean", normalize, True)
    folder = checkpoint / str(types["Pooling"].get("path", ""))
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}/config.json (the Pooling module's) is unreadable: {exc}") from None
    unsupported = [
        k for k in ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens") if config.get(k)
    ]
    chosen = [mode for key, mode in _MODE_KEYS if config.get(key)]
    if unsupported or len(chosen) != 1:
        raise ValueError(
            f"{folder}/config.json asks for pooling {unsupported + chosen or 'none'}: one of {MODES} is served"
        )
    return Pooling(chosen[0], normalize, True)


def max_seq_length(checkpoint: Path) -> int | None:
    """The longest input, in tokens, a sentence-transformers checkpoint says it was trained for
    (sentence_bert_config.json's max_seq_length: sentence-transformers cuts its inputs there,
    often short of the position table); None when it does not say."""
    try:
        value = json.loads((Path(checkpoint) / "sentence_bert_config.json").read_text()).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
