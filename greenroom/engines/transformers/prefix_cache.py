"""Automatic prefix reuse (transformers engine): the KV of prompts already prefilled, kept in a
prefix tree (a radix tree of token blocks, as SGLang's RadixCache), so a prompt that starts with
one of them prefills only what follows.

Each steering key (`Steering.key`: a prefix computed under other steering is other KV) has a
tree of its own. A node holds a run of whole BLOCKs of tokens — an edge of the tree — and their
KV ([1, kv heads, run, head dim] per layer, a copy of its own, never written after it is
stored); its children continue it, told apart by their first block. Prompts sharing a head share
its nodes: the head's KV is stored once. Storing a prompt walks from the root, splits the node it
leaves midway and adds what is new as one leaf. A lookup walks the same way, matching token for
token, and always leaves at least one token to prefill (the next token's logits come from that
forward); a hit's KV is its path's runs concatenated, once per layer.

A hit shorter than what is left to prefill is not taken: the rest's forward over stored KV
attends under an explicit mask, where a whole prompt's runs SDPA's causal kernel (half the pairs,
no mask to read), and on the CPU costs 2-3× a cold prefill per token — a short prefix saves less
than that costs (the 100m demo, 2,048 tokens: over a stored quarter as slow as cold, over a
stored half 0.83× the time).

The tree holds at most `max_bytes` of KV. Eviction takes leaves, least recently used first: a
node goes only once no prompt continues it (a head outlives every descendant), so a long shared
head — Open WebUI's tools block — stays while the conversations below it come and go. A prompt
longer than the room there is keeps its head, as much as fits.
"""

from __future__ import annotations

import heapq
import itertools

import attrs
import torch

BLOCK = 16  # tokens per block: reuse is block-aligned

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, heads, tokens, dim]


@attrs.define(eq=False)
class _Node:
    parent: _Node | None
    ids: list[int]  # the run's tokens (whole blocks; none at a root)
    kv: KV
    children: dict[tuple[int, ...], _Node] = attrs.Factory(dict)  # by each child's first block
    used: int = 0  # when a prompt last went through it (the tree's clock)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


class PrefixCache:
    def __init__(self, max_bytes: int, token_bytes: int):
        """`token_bytes`: one token's KV over every layer (what the bound in tokens is reported as)."""
        self.max_bytes, self.token_bytes = max_bytes, token_bytes
        self._roots: dict[object, _Node] = {}  # steering key → its tree
        self._clock = itertools.count(1)
        self.tokens = self.bytes = self.nodes = 0
        self.hits = self.misses = self.reused_tokens = 0

    def lookup(self, key, ids: list[int]) -> tuple[int, KV | None]:
        """The longest stored block-aligned prefix of `ids` computed under `key`, shorter than
        `ids` and at least half of it: (its length, its KV), or (0, None)."""
        path = self._walk(key, ids[: (len(ids) - 1) // BLOCK * BLOCK])
        length = sum(n for _, n in path)
        if not path or length < len(ids) - length:  # less than half the prompt: a cold prefill is faster
            self.misses += 1
            return 0, None
        now = next(self._clock)
        for node, _ in path:
            node.used = now
        self.hits += 1
        self.reused_tokens += length
        runs = [[(k[:, :, :n], v[:, :, :n]) for k, v in node.kv] for node, n in path]
        if len(runs) == 1:
            return length, runs[0]
        layers = zip(*runs)
        return length, [(torch.cat([k for k, _ in parts], 2), torch.cat([v for _, v in parts], 2)) for parts in layers]

    def store(self, key, ids: list[int], kv: KV) -> None:
        """Keep the whole blocks of `ids`' KV (`kv`, computed under `key`, is copied: the caller's
        tensors may go on growing), but for what the tree holds already."""
        whole = len(ids) // BLOCK * BLOCK
        if not whole or self.max_bytes < self.token_bytes * BLOCK:
            return
        path = self._walk(key, ids[:whole])
        now = next(self._clock)
        at, start = self._roots.get(key) or _Node(None, [], []), 0
        for node, n in path:  # a run it leaves midway is split: the rest was not used now
            at = node if n == len(node.ids) else self._split(node, n)
            at.used = now
            start += n
        if start == whole:
            return
        room = self._make_room(self.token_bytes * (whole - start), keep=at)
        end = start + room // self.token_bytes // BLOCK * BLOCK  # as much of the head as fits
        if end == start:
            return
        leaf = _Node(at, ids[start:end], [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in kv])
        leaf.used = now
        at.children[tuple(ids[start : start + BLOCK])] = leaf
        if at.parent is None:
            self._roots[key] = at
        self._count(leaf, 1)

    def _walk(self, key, ids: list[int]) -> list[tuple[_Node, int]]:
        """The nodes `ids` (whole blocks) goes through from `key`'s root, each with how many of its
        tokens match (whole blocks; all of them but maybe the last node's)."""
        node, path, at = self._roots.get(key), [], 0
        while node is not None and at < len(ids):
            child = node.children.get(tuple(ids[at : at + BLOCK]))
            if child is None:
                break
            n = _common_blocks(child.ids, ids, at)
            path.append((child, n))
            at += n
            node = child if n == len(child.ids) else None
        return path

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node`'s run after its first `n` tokens: the head becomes a node of its own, the
        parent of the rest (both copied, so either frees its memory when it goes)."""
        head = _Node(node.parent, node.ids[:n], [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in node.kv])
        head.used = node.used
        node.parent.children[tuple(node.ids[:BLOCK])] = head
        node.ids, node.kv, node.parent = (
            node.ids[n:],
            [(k[:, :, n:].clone(), v[:, :, n:].clone()) for k, v in node.kv],
            head,
        )
        head.children[tuple(node.ids[:BLOCK])] = node
        self.nodes += 1
        return head

    def _make_room(self, wanted: int, keep: _Node) -> int:
        """Evict leaves, least recently used first, until `wanted` bytes fit or only `keep`'s path
        is left (it is where the new run goes); the bytes free now."""
        if self.bytes + wanted <= self.max_bytes:
            return wanted
        leaves = [(n.used, id(n), n) for n in self._all() if not n.children and n is not keep]
        heapq.heapify(leaves)
        while leaves and self.bytes + wanted > self.max_bytes:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            del parent.children[tuple(leaf.ids[:BLOCK])]
            self._count(leaf, -1)
            if parent.children or parent is keep:
                continue
            if parent.parent is not None:  # a head no prompt continues now: a leaf itself
                heapq.heappush(leaves, (parent.used, id(parent), parent))
            else:  # an empty tree
                self._roots = {k: r for k, r in self._roots.items() if r is not parent}
        return max(0, min(wanted, self.max_bytes - self.bytes))

    def _all(self):
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            stack += node.children.values()
            if node.parent is not None:
                yield node

    def _count(self, node: _Node, sign: int) -> None:
        self.tokens += sign * len(node.ids)
        self.bytes += sign * node.nbytes
        self.nodes += sign

    def stats(self) -> dict:
        """What /metrics shows (the engine actor's status carries it)."""
        return {
            "max_bytes": self.max_bytes,
            "max_tokens": self.max_bytes // self.token_bytes,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "entries": self.nodes,
            "hits": self.hits,
            "misses": self.misses,
            "reused_tokens": self.reused_tokens,
        }


def _common_blocks(run: list[int], ids: list[int], at: int) -> int:
    """How many whole blocks of `run` match `ids` from `at`, in tokens."""
    n = min(len(run), len(ids) - at) // BLOCK * BLOCK
    if run[:n] == ids[at : at + n]:
        return n
    same = next(i for i, (a, b) in enumerate(zip(run, ids[at : at + n])) if a != b)
    return same // BLOCK * BLOCK
