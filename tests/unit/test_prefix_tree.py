"""The transformers engine's prefix tree (engines/transformers/prefix_cache.py) with no model: KV
made of the token ids themselves (keys = the ids, values = their negatives, two layers), so a
hit's KV shows which tokens it was stored for."""

from __future__ import annotations

import torch

from greenroom.engines.transformers.prefix_cache import BLOCK, PrefixCache

LAYERS = 2
TOKEN_BYTES = LAYERS * 2 * 4  # one float32 key and one value per layer


def kv(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    k = torch.tensor(ids, dtype=torch.float32).view(1, 1, -1, 1)
    return [(k + layer, -k - layer) for layer in range(LAYERS)]


def tree(tokens: int) -> PrefixCache:
    return PrefixCache(tokens * TOKEN_BYTES, TOKEN_BYTES)


def prompt(head: int, n: int, tail_from: int = 10_000) -> list[int]:
    """`n` tokens: the shared head 0…head-1, then tokens of their own from `tail_from`."""
    return list(range(head)) + list(range(tail_from, tail_from + n - head))


def reused(cache: PrefixCache, ids: list[int], key=()) -> int:
    """The tokens a lookup reuses, its KV checked against `ids`' own."""
    n, got = cache.lookup(key, ids)
    if n:
        for (k, v), (ek, ev) in zip(got, kv(ids[:n])):
            assert torch.equal(k, ek) and torch.equal(v, ev)
    return n


def test_a_shared_head_is_stored_once_and_reused_whole():
    cache = tree(10_000)
    head = 40 * BLOCK
    a, b = prompt(head, head + 100, 10_000), prompt(head, head + 100, 20_000)
    cache.store((), a, kv(a))
    cache.store((), b, kv(b))
    # the head once, each prompt's own whole blocks after it (100 tokens: 6 blocks)
    assert cache.stats()["tokens"] == head + 2 * 6 * BLOCK
    assert cache.stats()["bytes"] == cache.stats()["tokens"] * TOKEN_BYTES
    assert cache.stats()["entries"] == 3  # the head, split off a's run, and the two tails
    # a third prompt sharing the head, then the second's tail: the path's runs, joined
    c = b[: head + 4 * BLOCK] + [7] * 30
    assert reused(cache, c) == head + 4 * BLOCK
    assert reused(cache, prompt(head, head + 5, 30_000)) == head  # the head alone
    assert cache.stats()["hits"] == 2 and cache.stats()["reused_tokens"] == 2 * head + 4 * BLOCK


def test_a_hit_leaves_a_token_to_prefill_and_is_block_aligned():
    cache = tree(10_000)
    ids = list(range(4 * BLOCK))
    cache.store((), ids, kv(ids))
    assert reused(cache, ids) == 3 * BLOCK  # the whole prompt again: its last block is prefilled
    assert reused(cache, ids + [1]) == 4 * BLOCK
    assert reused(cache, ids[: 2 * BLOCK + 5]) == 2 * BLOCK
    assert reused(cache, [99] + ids) == 0
    assert cache.stats()["misses"] == 1


def test_a_prefix_shorter_than_the_rest_is_not_reused():
    cache = tree(10_000)
    ids = list(range(4 * BLOCK))
    cache.store((), ids, kv(ids))
    assert reused(cache, ids + [7] * 4 * BLOCK) == 4 * BLOCK  # half the prompt
    assert reused(cache, ids + [7] * (4 * BLOCK + 1)) == 0  # less: a cold prefill is faster
    assert cache.stats()["hits"] == cache.stats()["misses"] == 1


def test_a_hit_is_checked_token_for_token():
    cache = tree(10_000)
    ids = list(range(8 * BLOCK))
    cache.store((), ids, kv(ids))
    other = list(ids)
    other[5 * BLOCK + 3] = -1  # differs inside the sixth block
    assert reused(cache, other + [0]) == 5 * BLOCK


def test_steering_keys_are_separate_trees():
    cache = tree(10_000)
    ids = list(range(6 * BLOCK))
    cache.store(("steered", 1.0), ids, kv(ids))
    assert reused(cache, ids + [1], key=()) == 0
    assert reused(cache, ids + [1], key=("steered", 0.5)) == 0
    assert reused(cache, ids + [1], key=("steered", 1.0)) == 6 * BLOCK
    cache.store((), ids, kv(ids))
    assert cache.stats()["tokens"] == 2 * 6 * BLOCK  # the same tokens, under two keys


def test_leaves_go_before_their_heads_least_recently_used_first():
    head = 30 * BLOCK
    cache = tree(head + 3 * 10 * BLOCK)  # the head and three tails of 10 blocks
    tails = [prompt(head, head + 10 * BLOCK, 10_000 * (i + 1)) for i in range(4)]
    for ids in tails[:3]:
        cache.store((), ids, kv(ids))
    assert cache.stats()["tokens"] == head + 30 * BLOCK
    assert reused(cache, tails[0] + [1]) == head + 10 * BLOCK  # the first is used again
    cache.store((), tails[3], kv(tails[3]))  # a fourth: the least recently used leaf (the second) goes
    assert reused(cache, tails[1] + [1]) == head
    assert reused(cache, tails[2] + [1]) == head + 10 * BLOCK
    assert reused(cache, tails[0] + [1]) == head + 10 * BLOCK
    assert reused(cache, tails[3] + [1]) == head + 10 * BLOCK
    assert cache.stats()["tokens"] <= cache.stats()["max_tokens"]


def test_a_head_goes_only_after_every_prompt_continuing_it():
    head = 20 * BLOCK
    cache = tree(head + 3 * 10 * BLOCK)
    a, b = (prompt(head, head + 10 * BLOCK, start) for start in (10_000, 20_000))
    alone = [list(range(start, start + n * BLOCK)) for start, n in ((50_000, 10), (60_000, 10), (70_000, 20))]
    for ids in (a, b, alone[0]):
        cache.store((), ids, kv(ids))
    assert cache.lookup((), b + [1])[0] == len(b)  # b's path (the head and its tail) used last but one
    assert cache.lookup((), alone[0] + [1])[0] == len(alone[0])
    cache.store((), alone[1], kv(alone[1]))  # a's tail goes: the least recently used leaf
    held = cache.stats()["tokens"]
    # 20 blocks: b's tail goes, then the head it leaves a leaf (older than the other leaves)
    cache.store((), alone[2], kv(alone[2]))
    assert cache.stats()["tokens"] == held - 10 * BLOCK - head + 20 * BLOCK
    assert [reused(cache, ids + [1]) for ids in (a, b, *alone)] == [0, 0, *(len(ids) for ids in alone)]


def test_the_bound_is_honoured_and_a_longer_prompt_keeps_its_head():
    cache = tree(50 * BLOCK)
    short = prompt(0, 10 * BLOCK, 70_000)
    cache.store((), short, kv(short))
    long = list(range(200 * BLOCK))
    cache.store((), long, kv(long))
    stats = cache.stats()
    assert stats["tokens"] == 50 * BLOCK == stats["max_tokens"] and stats["bytes"] == stats["max_bytes"]
    assert reused(cache, long[: 90 * BLOCK]) == 50 * BLOCK  # its head, as much as fits; the other prompt went
    assert reused(cache, short + [1]) == 0
    tiny = tree(BLOCK - 1)  # not one block fits: nothing is stored
    tiny.store((), long, kv(long))
    assert tiny.stats()["tokens"] == 0


def test_the_stored_kv_is_a_copy():
    cache = tree(10_000)
    ids = list(range(4 * BLOCK))
    tensors = kv(ids)
    cache.store((), ids, tensors)
    for k, v in tensors:
        k.fill_(0)
        v.fill_(0)
    assert reused(cache, ids + [1]) == 4 * BLOCK
