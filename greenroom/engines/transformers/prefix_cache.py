"""Automatic prefix reuse (transformers engine): the KV of prompts already prefilled, kept in a
bounded store, so a prompt that starts with one of them prefills only what follows.

An entry is one prompt's KV ([1, kv heads, length, head dim] per layer) and the key of the
steering it was computed under (`Steering.key`: a prefix computed under other steering is other
KV). Every whole BLOCK of the prompt indexes the entry by a hash chained block by block (vLLM's
scheme) and seeded with that key, so a later prompt sharing any block-aligned prefix finds it in
one dict lookup per block. A hit is checked token for token (the hash is only a hint) and always
leaves at least one token to prefill: the next token's logits come from that forward. An entry
whose every block a newer one also indexes is dropped (the newer one holds all of it). The store
holds at most `max_tokens` tokens of KV; the least recently used entries go first.
"""

from __future__ import annotations

import collections

import attrs
import torch

BLOCK = 16  # tokens per hashed block: reuse is block-aligned


@attrs.define(eq=False)
class _Entry:
    key: object
    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    hashes: list[int]
    indexed: int = 0  # how many index slots point here


class PrefixCache:
    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._lru: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # id(entry) → entry
        self._index: dict[int, _Entry] = {}  # chained block hash → the newest entry holding that prefix
        self.tokens = self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0

    def lookup(self, key, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest stored block-aligned prefix of `ids` computed under `key`, shorter than
        `ids`: (its length, its KV as views), or (0, None)."""
        hashes = _chain(key, ids[:-1])
        for n in range(len(hashes), 0, -1):
            entry = self._index.get(hashes[n - 1])
            length = n * BLOCK
            if entry is not None and entry.key == key and entry.ids[:length] == ids[:length]:
                self._lru.move_to_end(id(entry))
                self.hits += 1
                self.reused_tokens += length
                return length, [(k[:, :, :length], v[:, :, :length]) for k, v in entry.kv]
        self.misses += 1
        return 0, None

    def store(self, key, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep `ids`' KV (computed under `key`; the tensors are never written to afterwards)."""
        hashes = _chain(key, ids)
        if not hashes or len(ids) > self.max_tokens:
            return
        held = self._index.get(hashes[-1])
        if held is not None and held.key == key and held.ids[: len(hashes) * BLOCK] == ids[: len(hashes) * BLOCK]:
            self._lru.move_to_end(id(held))  # every block of it is held already
            return
        entry = _Entry(key, list(ids), kv, hashes)
        for h in hashes:
            older = self._index.get(h)
            self._index[h] = entry
            entry.indexed += 1
            if older is not None:
                older.indexed -= 1
                if not older.indexed:  # the new entry holds all of it
                    self._drop(older)
        self._lru[id(entry)] = entry
        self.tokens += len(ids)
        self.bytes += _nbytes(kv)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._lru.values())))

    def _drop(self, entry: _Entry) -> None:
        del self._lru[id(entry)]
        for h in entry.hashes:
            if self._index.get(h) is entry:
                del self._index[h]
        self.tokens -= len(entry.ids)
        self.bytes -= _nbytes(entry.kv)

    def stats(self) -> dict:
        """What /metrics shows (the engine actor's status carries it)."""
        return {
            "max_tokens": self.max_tokens,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "entries": len(self._lru),
            "hits": self.hits,
            "misses": self.misses,
            "reused_tokens": self.reused_tokens,
        }


def _chain(key, ids: list[int]) -> list[int]:
    """The chained hash of each whole block of `ids`, seeded with `key`."""
    h, out = hash(key), []
    for start in range(0, len(ids) - BLOCK + 1, BLOCK):
        h = hash((h, *ids[start : start + BLOCK]))
        out.append(h)
    return out


def _nbytes(kv) -> int:
    return sum(k.nbytes + v.nbytes for k, v in kv)
