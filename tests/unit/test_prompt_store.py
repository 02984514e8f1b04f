"""The llama.cpp engine's RAM prompt store (engines/llama_cpp/prompt_store.py): a prefix tree of
prefill-grid cells; the longest stored prefix of a prompt, from the newest state holding it;
states another extends are dropped; past the byte bound, a state whose head another holds goes
before the last holder of a head, least recently used first."""

import pytest

from greenroom.config import load_config
from greenroom.engines.llama_cpp.gguf_meta import DEFAULT_WINDOW, default_window
from greenroom.engines.llama_cpp.prompt_store import PREFILL_GRID as G
from greenroom.engines.llama_cpp.prompt_store import PromptStore
from greenroom.engines.reuse_budget import reuse_bytes


def ids(*cells: int, extra: int = 0) -> list[int]:
    """Whole grid cells, cell `c` of the token c repeated, and `extra` tokens after them."""
    return [t for c in cells for t in [c] * G] + [999] * extra


def test_the_longest_stored_prefix_leaves_a_token_to_prefill():
    store = PromptStore(10_000)
    assert store.longest(None, ids(1, 2, extra=5)) == (0, None)
    assert store.put(None, ids(1, 2, 3), b"x" * 30)
    stored, state = store.longest(None, ids(1, 2, extra=5))
    assert stored == 2 * G and state.tokens == ids(1, 2, 3)  # a prefix of a state: restored, then cut
    assert store.longest(None, ids(1, 2, 3))[0] == 2 * G  # the same prompt: its last cell is computed again
    assert store.longest(None, ids(1, 2, 3, extra=1))[0] == 3 * G
    assert store.longest(None, ids(2, 1, extra=1)) == (0, None)
    assert store.longest(b"steered", ids(1, 2, 3, extra=1)) == (0, None)  # the control vector is part of the key
    assert store.put(None, [1] * (G + 1), b"x") is False  # only whole cells
    assert store.put(None, ids(1), b"x" * 10) is False  # already held (by 1, 2, 3)


def test_a_state_another_extends_is_dropped_and_branches_share_their_head():
    store = PromptStore(10_000)
    store.put(None, ids(1, 2), b"a" * 20)
    store.put(None, ids(1, 2, 3, 4), b"b" * 40)  # extends the first: it restores both
    assert store.stats()["entries"] == 1 and store.bytes == 40 and store.tokens == 4 * G
    store.put(None, ids(1, 2, 5), b"c" * 30)  # a branch off the shared head
    assert store.stats()["entries"] == 2 and store.bytes == 70
    head, state = store.longest(None, ids(1, 2, 7, extra=1))
    assert head == 2 * G and state.tokens == ids(1, 2, 5)  # the newest holder of the head
    store.served(head, state)
    assert store.longest(None, ids(1, 2, 3, extra=1))[1].tokens == ids(1, 2, 3, 4)
    assert store.stats() | {"max_tokens": 0} == {
        "max_tokens": 0,
        "tokens": 7 * G,
        "bytes": 70,
        "entries": 2,
        "hits": 1,
        "misses": 0,
        "reused_tokens": 2 * G,
        "restored": 1,
    }


def test_past_the_bound_leaves_go_before_heads():
    store = PromptStore(100)
    store.put(None, ids(1, 2, 3), b"a" * 30)  # conversation a, on the shared head (1, 2)
    store.put(None, ids(9), b"z" * 30)  # a prompt sharing nothing, older than b
    store.put(None, ids(1, 2, 4), b"b" * 30)
    store.served(2 * G, store.longest(None, ids(1, 2, 3, extra=1))[1])  # a is used again: b is now the oldest
    store.put(None, ids(1, 2, 5), b"c" * 30)  # 120 > 100: one goes
    # z is the least recently used, but it is the last holder of its head; b's head a still holds
    assert {tuple(s.tokens[::G]) for s in store._states} == {(1, 2, 3), (9,), (1, 2, 5)}
    assert store.bytes == 90
    store.put(None, ids(7), b"y" * 30)  # again: a (the oldest of those sharing a head) goes before z
    assert {tuple(s.tokens[::G]) for s in store._states} == {(9,), (1, 2, 5), (7,)}
    assert store.longest(None, ids(1, 2, 3, extra=1))[0] == 2 * G  # the head survives in c
    assert store.put(None, ids(8), b"w" * 101) is False  # past the bound alone: not kept
    assert store.bytes == 90


def test_dropping_prunes_the_tree():
    store = PromptStore(60)
    store.put(None, ids(1, 2), b"a" * 30)
    store.put(b"k", ids(3), b"b" * 30)
    store.put(None, ids(4), b"c" * 30)  # the oldest, a, goes (no head is shared)
    assert store.longest(None, ids(1, 2, extra=1)) == (0, None)
    assert list(store._roots[None].children) == [tuple(ids(4))]
    store.put(None, ids(5), b"d" * 30)  # b goes, and its tree with it
    assert list(store._roots) == [None] and store.tokens == 2 * G


def test_default_window_from_memory():
    gib, kv = 2**30, 23_040  # SmolLM2-135M's KV bytes per token
    assert default_window(8192, kv, 4, available=16 * gib) == 8192  # its trained window fits
    assert default_window(131_072, kv, 4, available=16 * gib) == 32_768  # the largest power of two that fits a quarter
    assert default_window(131_072, kv, 4, available=gib // 2) == DEFAULT_WINDOW  # never below the old default
    assert default_window(2048, kv, 4, available=gib // 2) == 2048  # nor past the trained one
    assert default_window(8192, None, 4, available=16 * gib) == DEFAULT_WINDOW  # no KV cache to size
    assert reuse_bytes(16 * gib) == 4 * gib and reuse_bytes(64 * gib) == 8 * gib
    assert reuse_bytes(64 * gib, host=False) == 16 * gib  # a card's free memory is not capped


def test_the_config_sizes_both_from_memory_unless_told():
    config = load_config(env={})
    assert config.gguf_n_ctx is None and config.gguf_cache_ram_mib is None
    told = load_config(env={"GREENROOM_GGUF_N_CTX": "8192", "GREENROOM_GGUF_CACHE_RAM_MIB": "0"})
    assert told.gguf_n_ctx == 8192 and told.gguf_cache_ram_mib == 0
    with pytest.raises(ValueError, match="gguf_cache_ram_mib is a size in MiB"):
        load_config(env={"GREENROOM_GGUF_CACHE_RAM_MIB": "-1"})
