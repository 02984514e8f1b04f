"""A GGUF file's header — its key/values and tensor infos — read without the weights:
for model names (gguf_files.py), the llama.cpp engine's quantization label, the Ollama
metadata routes and the KV cache a load will allocate (supervisor/memory.py).
`gguf.GGUFReader` maps every array into numpy (2.2 s for SmolLM2-135M's file,
measured); this reads the header through mmap and struct (12 ms) and
steps over long arrays (the vocabulary, its merges and scores), keeping their length and
where they start. Imports nothing heavy: the front end imports it."""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from pathlib import Path

import attrs

from ..reuse_budget import available_memory

MAGIC = b"GGUF"
# arrays longer than this are stepped over (Ollama shows them as null unless asked to be verbose)
MAX_ARRAY = 1024
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_DIMS = 8  # llama.cpp refuses a tensor of more than 4
_CACHE_MAX = 512

# gguf's LlamaFileType (general.file_type), named as llama.cpp's quantize tool names them
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    1024: "GUESSED",
}


class GGUFError(ValueError):
    """The file is not a GGUF header this reader understands (magic, version, truncation)."""


@attrs.frozen
class Skipped:
    """An array stepped over: its elements' GGUF value type, how many, and the offset of
    the first element (read it with `read_array`)."""

    type: int
    count: int
    offset: int


@attrs.frozen
class GGUFMeta:
    version: int
    byteorder: str  # struct's "<" or ">"
    fields: dict  # key → int | float | bool | str | list | Skipped, in the file's order
    tensor_count: int
    parameters: int  # elements of every tensor: what llama.cpp's n_params counts

    def get(self, key: str, default=None):
        """A key's value, or `default` when the key is absent or its array was stepped over."""
        value = self.fields.get(key, default)
        return default if isinstance(value, Skipped) else value


_cache: dict[str, tuple[tuple[int, int], GGUFMeta]] = {}
_cache_lock = threading.Lock()  # the routes read headers from worker threads


def read(path: str | Path) -> GGUFMeta:
    """The header of the GGUF file at `path`, cached by (path, size, mtime_ns)."""
    key = os.fspath(path)
    st = os.stat(key)
    stamp = (st.st_size, st.st_mtime_ns)
    hit = _cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    meta = _parse(key)
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))  # the oldest entry
        _cache[key] = (stamp, meta)
    return meta


def read_array(path: str | Path, meta: GGUFMeta, skipped: Skipped) -> list:
    """The elements of an array `read` stepped over."""
    with _mapped(os.fspath(path)) as buf:
        try:
            return _Cursor(buf, meta.byteorder, skipped.offset).elements(skipped.type, skipped.count)
        except struct.error:
            raise GGUFError(f"{path}: the array runs past the end of the file") from None


def file_type_label(meta: GGUFMeta) -> str:
    """`Q4_K_M`, `F16`, … from general.file_type; F32 when absent (llama.cpp's default),
    GUESSED when the value is not one llama.cpp knows."""
    return file_type_name(meta.get("general.file_type"))


def file_type_name(value) -> str:
    """The label of a general.file_type value as the header holds it (an int), or as
    llama.cpp's own metadata renders it (its decimal text): what the llama.cpp engine
    reports without reading the header again."""
    if value is None:
        return "F32"
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    return FILE_TYPES.get(value, "GUESSED") if isinstance(value, int) and not isinstance(value, bool) else "GUESSED"


# llama.cpp's KV cache holds each cell's keys and values as f16 (its contexts' default type_k/type_v)
KV_CELL_BYTES = 2
# the llama.cpp engine's generation context decodes in ubatches of up to this many tokens; its compute
# buffer is sized for a ubatch whose every row has float32 logits
GENERATION_UBATCH = 512
# an embedding request's inputs are packed into decodes of at most this many tokens on one thread.
# Attention spans every sequence of a decode, masked, so its share grows with the decode
# (all-MiniLM F16, 128 inputs of ~40 tokens, one thread: 15 % of the CPU in 512-token decodes, 9 %
# in 128), while a decode too small re-reads the weights for few rows (one input a decode: 1.6×
# slower). CPU seconds, same process, interleaved: 512 tokens 1.79, 384 1.70, 256 1.65, 128 1.67
# (~13-token inputs: 0.65 at 512, 0.59 at 256; ~103-token inputs alike); 2048 was 1.6× slower
EMBED_TOKENS = 256
# on two threads (or more: not measured) twice that: a decode's threads meet after every op, and
# fewer, larger decodes won (all-MiniLM, 2 threads, wall: 512 tokens 0.99-1.03 s against 1.05-1.08
# in 256, 5 interleaved pairs; one thread the other way: 256 1.74-1.76 s against 1.78-1.84)
EMBED_TOKENS_THREADED = 512
LOGIT_BYTES = 4


# a default window (`default_window`) is never smaller than this, the fixed default it replaced
DEFAULT_WINDOW = 4096
# a default window's KV cache (every sequence's) takes at most this share of the available memory
WINDOW_MEMORY_SHARE = 1 / 4


def window(n_ctx: int | None, trained: int, kv_per_token: int | None = None, parallel: int = 1) -> int:
    """The context window llama.cpp is given for a requested `n_ctx`: the request capped at
    the model's trained window, which 0 asks for; None: `default_window` (DEFAULT_WINDOW when
    the file records no trained window)."""
    if n_ctx is None:
        n_ctx = default_window(trained, kv_per_token, parallel)
    return min(n_ctx or trained, trained) if trained > 0 else (n_ctx or DEFAULT_WINDOW)


def default_window(trained: int, kv_per_token: int | None, parallel: int, available: int | None = None) -> int:
    """A window sized for real prompts (Open WebUI sends ~7,000 tokens of tools with every chat):
    the model's trained window where `parallel` sequences of it fit WINDOW_MEMORY_SHARE of the
    `available` memory (the host's now, by default), else the largest power of two that does,
    never less than DEFAULT_WINDOW; DEFAULT_WINDOW when the cache's width is unknown (an embedding
    model keeps none)."""
    if not kv_per_token or trained <= 0:
        return DEFAULT_WINDOW
    if available is None:
        available = available_memory()
    fits = int(available * WINDOW_MEMORY_SHARE) // (kv_per_token * max(1, parallel))
    if fits >= trained:
        return trained
    return min(trained, max(DEFAULT_WINDOW, 1 << max(fits.bit_length() - 1, 0)))


def kv_bytes(n_layer: int, head_count_kv: int | list, key_length: int, value_length: int) -> int:
    """Bytes of KV cache per token: each layer's K and V rows in f16. `head_count_kv` is one
    count for every layer or a list of one per layer (0 for a layer without attention). With
    the full-size cache of sliding-window layers (llama_cpp_engine's swa_full), exact."""
    heads = head_count_kv if isinstance(head_count_kv, list) else [head_count_kv] * n_layer
    return sum(heads[:n_layer]) * (key_length + value_length) * KV_CELL_BYTES


def kv_bytes_per_token(meta: GGUFMeta) -> int | None:
    """Bytes of KV cache per token of the model whose header is `meta` (`kv_bytes`), from
    {arch}.block_count, .attention.head_count_kv (else .head_count), .attention.key_length /
    .value_length (else embedding_length / head_count); None when the header lacks them."""
    arch = meta.get("general.architecture")
    field = lambda key: meta.get(f"{arch}.{key}")  # noqa: E731
    layers, heads = field("block_count"), field("attention.head_count")
    kv_heads = field("attention.head_count_kv")
    kv_heads = heads if kv_heads is None else kv_heads
    head = heads[0] if isinstance(heads, list) else heads  # per-layer query heads: the width is one head's
    embedding = field("embedding_length")
    default = embedding // head if isinstance(embedding, int) and isinstance(head, int) and head > 0 else None
    key, value = field("attention.key_length") or default, field("attention.value_length") or default
    if not all(isinstance(x, int) for x in (layers, key, value)) or not isinstance(kv_heads, int | list):
        return None
    return kv_bytes(layers, kv_heads, key, value)


def context_bytes(kv_per_token: int, n_vocab: int, cells: int) -> int:
    """What a generation context of `cells` KV cells allocates beside the weights: its KV cache,
    and the bulk of its compute buffer — a ubatch's logits (llama.cpp logs the buffer at 98.25
    MiB for SmolLM2, 514.5 for Gemma 3, whose logits are 96 and 512 of it)."""
    return cells * kv_per_token + min(cells, GENERATION_UBATCH) * n_vocab * LOGIT_BYTES


def embedding_only(meta) -> bool:
    """Whether the model is an embedding model, by Ollama's rule: its header names a pooling type
    (`{arch}.pooling_type`: BERT and the sentence-embedding models llama.cpp's converter writes).
    llama.cpp runs one to pooled vectors; it generates nothing. `meta`: a GGUFMeta or llama.cpp's
    metadata dict."""
    return meta.get(f"{meta.get('general.architecture')}.pooling_type") is not None


def embed_tokens(threads: int) -> int:
    """The most tokens packed into one embedding decode computed on `threads` threads."""
    return EMBED_TOKENS if threads <= 1 else EMBED_TOKENS_THREADED


def embedding_ubatch(n_ctx: int) -> int:
    """The ubatch of a model's embeddings context: the largest packing (EMBED_TOKENS_THREADED), or
    its window when one input may be longer (llama.cpp pools a sequence within one ubatch)."""
    return max(n_ctx, EMBED_TOKENS_THREADED)


def encoder_bytes(head_count: int, n_ctx: int) -> int:
    """The bulk of an embedding model's context beside its weights: no KV cache (llama.cpp keeps
    none for an encoder), the attention scores of a ubatch's every row against every other."""
    ubatch = embedding_ubatch(n_ctx)
    return ubatch * ubatch * head_count * LOGIT_BYTES


def load_bytes(meta: GGUFMeta, file_bytes: int, n_ctx: int | None, parallel: int) -> int:
    """About what loading the model takes before it is loaded: its file, and the generation
    context `parallel` sequences of `n_ctx` (`window`) take (`context_bytes`; an embedding model's
    context: `encoder_bytes`); the file alone when its header does not say how wide its cache is."""
    arch = meta.get("general.architecture")
    heads = meta.get(f"{arch}.attention.head_count")
    if embedding_only(meta) and isinstance(heads, int):
        trained = meta.get(f"{arch}.context_length")
        return file_bytes + encoder_bytes(heads, window(n_ctx, trained if isinstance(trained, int) else 0))
    per_token = kv_bytes_per_token(meta)
    if per_token is None:
        return file_bytes
    trained = meta.get(f"{arch}.context_length")
    cells = window(n_ctx, trained if isinstance(trained, int) else 0, per_token, parallel) * parallel
    tokens = meta.fields.get("tokenizer.ggml.tokens")
    n_vocab = tokens.count if isinstance(tokens, Skipped) else len(tokens or ()) or meta.get(f"{arch}.vocab_size", 0)
    return file_bytes + context_bytes(per_token, n_vocab, cells)


@contextlib.contextmanager
def _mapped(path: str):
    """The file mapped read-only: only the pages the header lies in are ever read."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFError(f"{path} is empty") from None
    try:
        yield buf
    finally:
        buf.close()


def _parse(path: str) -> GGUFMeta:
    with _mapped(path) as buf:
        try:
            if buf[:4] != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file")
            # the version is in the file's byte order: a big-endian one's reads as a multiple of 2**16 here
            byteorder = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
            cur = _Cursor(buf, byteorder, 4)
            version = cur.scalar(4)
            if version not in (2, 3):
                raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
            tensor_count, kv_count = cur.scalar(10), cur.scalar(10)
            # every key/value takes 13 bytes at least, every tensor info 24: a corrupt count fails here
            if kv_count * 13 + tensor_count * 24 > len(buf):
                raise GGUFError(f"{path}: the GGUF header counts more entries than the file holds")
            fields = {}
            for _ in range(kv_count):
                name = cur.string()
                fields[name] = cur.value(cur.scalar(4))
            parameters = 0
            for _ in range(tensor_count):
                cur.skip_string()  # the tensor's name
                n_dims = cur.scalar(4)
                if n_dims > _MAX_DIMS:
                    raise GGUFError(f"{path}: a tensor of {n_dims} dimensions")
                count = 1
                for _ in range(n_dims):
                    count *= cur.scalar(10)
                cur.pos += 12  # its type (u32) and data offset (u64)
                parameters += count
            cur.check()
        except struct.error:
            raise GGUFError(f"{path}: the GGUF header is truncated") from None
        return GGUFMeta(version, byteorder, fields, tensor_count, parameters)


class _Cursor:
    def __init__(self, buf, byteorder: str, pos: int):
        self.buf, self.order, self.pos = buf, byteorder, pos
        self._u64 = struct.Struct(byteorder + "Q").unpack_from

    def check(self) -> None:
        if self.pos > len(self.buf):
            raise GGUFError("the GGUF header runs past the end of the file")

    def scalar(self, kind: int):
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GGUFError(f"unknown GGUF value type {kind}")
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        (n,) = self._u64(self.buf, self.pos)
        start = self.pos + 8
        self.pos = start + n
        self.check()
        return self.buf[start : self.pos].decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.pos += 8 + self._u64(self.buf, self.pos)[0]

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            return self.scalar(kind)
        item, count = self.scalar(4), self.scalar(10)
        if count <= MAX_ARRAY:
            return self.elements(item, count)
        skipped = Skipped(item, count, self.pos)
        self._skip(item, count)
        return skipped

    def elements(self, kind: int, count: int) -> list:
        fmt = _SCALARS.get(kind)
        if fmt is not None:  # a run of fixed-size values: one unpack
            values = list(struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.pos))
            self.pos += count * struct.calcsize(fmt)
            return values
        return [self.value(kind) for _ in range(count)]

    def _skip(self, kind: int, count: int) -> None:
        fmt = _SCALARS.get(kind)
        if fmt is not None:
            self.pos += count * struct.calcsize(fmt)
        elif kind not in (_STRING, _ARRAY):
            raise GGUFError(f"unknown GGUF value type {kind}")
        # a string is its length and its bytes, an array its type, count and elements: a corrupt
        # count that cannot fit fails before the walk
        elif count * (8 if kind == _STRING else 12) > len(self.buf) - self.pos:
            raise GGUFError("an array runs past the end of the file")
        elif kind == _STRING:  # each string's length says where the next one starts
            u64, buf, pos = self._u64, self.buf, self.pos
            for _ in range(count):
                pos += 8 + u64(buf, pos)[0]
            self.pos = pos
        else:
            for _ in range(count):
                self._skip(self.scalar(4), self.scalar(10))
        self.check()
