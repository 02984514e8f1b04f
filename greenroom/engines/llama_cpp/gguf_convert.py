"""A GGUF file → a transformers checkpoint directory: the weights dequantised to float32
safetensors, the tokenizer and its chat template from the file, config.json and
generation_config.json from its metadata. `greenroom convert --from-gguf` and the
`gguf-converted:<source>` model source (converted once into the model cache) both run
`convert_gguf`.

Not `from_pretrained(dir, gguf_file=…)`: in transformers 5.24 it needs accelerate, and the
model it returns refuses `save_pretrained`. `load_gguf_checkpoint` dequantises every tensor
through the `gguf` package and names it as transformers does (the Q/K rows permuted back
from llama.cpp's rope order), so the state dict is written as it is.

The tokenizer is transformers' GGUF one, split as llama.cpp splits (`_match_pre_tokenizer`)
and checked against llama.cpp's own on a probe text before anything is written; answers end
at llama.cpp's end-of-generation tokens. The weights are what llama.cpp's kernels
approximate, not the checkpoint the file was quantized from: float32 here, quantized dot
products there, so greedy texts agree for a while and then may part (SmolLM2's Q4_1: along
llama.cpp's greedy answers the top-1 token is the same at 94 % of steps, and elsewhere
llama.cpp's token is the second, within 0.21 logits; tests/live/test_real_model.py).

torch and transformers are imported inside the functions: the front end resolves a
converted source's directory (loader.source_path) without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path

from ..built_dirs import ensure_built

# bump when the written files would change; cached conversions with another version are rebuilt
CONVERTER_VERSION = 1
CONVERTED_DIR = "gguf-converted"
WEIGHTS_FILE = "model.safetensors"

# tokenised by both tokenizers before anything is written (a difference refuses the file):
# digits after runs of spaces, punctuation, accents, CJK and emoji, code, chat markup
PROBE_TEXT = (
    "<|im_start|>user\nIn 2024,  3.14159 + 12345 = ?\n\n  x    42 'll've Café naïve €4.80 日本語 😀"
    '\r\n\tdef f(x):\n        return {"city": "Paris"}<|im_end|>\n<|im_start|>assistant\n'
)


def converted_dir(cache_dir: Path, gguf_file: Path) -> Path:
    """Where the conversion of `gguf_file` lives in the cache (built or not): named for the
    file and a hash of its absolute path, so two files of one name do not share it."""
    gguf_file = Path(gguf_file).expanduser().absolute()
    digest = hashlib.sha256(str(gguf_file).encode()).hexdigest()[:10]
    return Path(cache_dir) / CONVERTED_DIR / f"{gguf_file.stem}-{digest}"


def ensure_converted(cache_dir: Path, gguf_file: Path, converting: Callable[[], None] | None = None) -> Path:
    """The cached conversion of `gguf_file`, converted on first use and again when the file
    changes (its size or modification time) or the converter does; `converting()` is called
    when a conversion starts (a load says so: it takes 25 s to minutes)."""
    gguf_file = Path(gguf_file).expanduser().absolute()
    stat = gguf_file.stat()
    marker = {
        "converter_version": CONVERTER_VERSION,
        "gguf": str(gguf_file),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }

    def build(out: Path) -> None:
        if converting is not None:
            converting()
        convert_gguf(gguf_file, out)

    return ensure_built(converted_dir(cache_dir, gguf_file), marker, build)


def convert_gguf(gguf_file: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint of `gguf_file` into `out_dir` (created if missing). ValueError
    for a file transformers cannot map (an architecture or tensor it does not know) or whose
    tokenizer it cannot rebuild as llama.cpp tokenises."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a server's log is no terminal
    gguf_file, out_dir = Path(gguf_file).expanduser(), Path(out_dir).expanduser()
    if not gguf_file.is_file():  # else transformers looks for it on the Hub
        raise FileNotFoundError(f"{gguf_file} is not a file")
    # the metadata under transformers' names (what AutoConfig.from_pretrained(gguf_file=…) reads)
    parsed = load_gguf_checkpoint(str(gguf_file), return_tensors=False)
    settings = {k: v for k, v in parsed["config"].items() if k != "_model_name_or_path"}  # general.name
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    pre = parsed["tokenizer"].get("pre_tokenizer_type")
    _match_pre_tokenizer(tokenizer, pre)
    llama_ids, eog = _llama_vocab(gguf_file, PROBE_TEXT)
    if tokenizer.encode(PROBE_TEXT) != llama_ids:
        raise ValueError(
            f"{gguf_file.name}: transformers' tokenizer for this file (pre-tokenizer {pre!r}) does "
            "not tokenise as llama.cpp does, and greenroom knows no split rule that would"
        )

    with torch.device("meta"):  # only its parameter names are needed: they map the GGUF's tensors
        model = AutoModelForCausalLM.from_config(config)
    # its dequantising loop draws a tqdm bar on stderr whatever transformers' settings say
    with contextlib.redirect_stderr(io.StringIO()):
        tensors = load_gguf_checkpoint(
            str(gguf_file), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
        )["tensors"]
    wanted = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if set(tensors) != wanted:
        missing, extra = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
        raise ValueError(
            f"{gguf_file.name}: the GGUF's tensors do not map onto {type(model).__name__}"
            f" (missing {missing[:5]}, unexpected {extra[:5]})"
        )

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, out_dir / WEIGHTS_FILE, metadata={"format": "pt"})
    os.chmod(out_dir / WEIGHTS_FILE, 0o644)  # save_file writes it 0600
    config.architectures = [type(model).__name__]
    config.dtype = torch.float32
    config.save_pretrained(out_dir)  # the file's context length, bos/eos/pad ids
    # an answer ends where llama.cpp ends it: at every end-of-generation token its vocabulary
    # marks (the file's eos/eot/eom ids and the end-of-turn tokens it knows by their text;
    # SmolLM2: <|endoftext|>, <|im_end|>, <reponame>)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eog, pad_token_id=config.pad_token_id
    ).save_pretrained(out_dir)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)  # with the file's chat template
    return out_dir


def _match_pre_tokenizer(tokenizer, pre: str | None) -> None:
    """Split text before BPE as llama.cpp does for the file's `tokenizer.ggml.pre`, where
    transformers' GGUF tokenizer does not know that name (it then splits with GPT-2's regex).
    SmolLM's vocabulary was learned with every digit a word of its own: llama.cpp's
    LLAMA_VOCAB_PRE_TYPE_SMOLLM splits `\\p{N}` first, then applies GPT-2's regex (without
    that, "x  2" is 3 tokens there and 4 here)."""
    from tokenizers import Regex, pre_tokenizers

    if pre == "smollm":
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )


def _llama_vocab(gguf_file: Path, text: str) -> tuple[list[int], list[int]]:
    """llama.cpp's tokens for `text` (BOS as the file asks, special tokens parsed) and its
    end-of-generation ids, from a vocabulary-only load (no weights, no compute)."""
    import llama_cpp

    from . import llama_cpp_engine  # noqa: F401  importing it routes llama.cpp's log to greenroom's

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(gguf_file).encode(), params)
    if not model:
        raise ValueError(f"llama.cpp could not read the vocabulary of {gguf_file}")
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        raw = text.encode()
        ids = (llama_cpp.llama_token * (len(raw) + 2))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), ids, len(ids), True, True)
        eog = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        return list(ids[:n]), eog
    finally:
        llama_cpp.llama_model_free(model)
