"""Prompt states kept in host RAM for the llama.cpp engine, as llama-server's `--cache-ram` prompt
cache keeps them: when a sequence slot is about to drop a prompt it prefilled (another prompt
takes the slot), the slot's cells of that prompt — whole cells of the prefill grid — are copied
out (llama_state_seq_get_data) and kept here, keyed by their token ids and the key of the control
vector they were prefilled under. A later prompt whose longest stored prefix beats what any free
slot holds has it copied back into its slot (llama_state_seq_set_data) and prefills only the rest.

The keys are a prefix tree of grid cells (one node per PREFILL_GRID tokens), one tree per control
vector key; a state is held at the node where its tokens end and restores any prefix of itself
(the slot is cut after the copy), so conversations sharing a long head (Open WebUI's tools block)
all restore it. A state is its whole prompt's cells — llama.cpp's format is one sequence's cells,
not a cell's — so a state another one extends is dropped for it, and states sit at the tree's
leaves. Bounded by bytes; past the bound the least recently used state goes first among those
whose head another state still holds (a leaf before a head), and the last holder of a head only
after those. Pure bookkeeping: the engine copies the bytes (llama_cpp_engine.py)."""

from __future__ import annotations

import itertools

PREFILL_GRID = 128  # tokens per cell of the prefill grid (llama_cpp_engine's module docstring)


class _Node:
    __slots__ = ("cell", "children", "depth", "held", "parent", "state")

    def __init__(self, parent: _Node | None, cell: tuple[int, ...] = ()):
        self.parent, self.cell = parent, cell  # the tokens of the cell that leads here
        self.depth = parent.depth + 1 if parent is not None else 0
        self.children: dict[tuple[int, ...], _Node] = {}
        self.state: State | None = None
        self.held = 0  # states at or below this node


class State:
    """One stored prompt: its tokens (whole grid cells), its key, llama.cpp's bytes of its cells."""

    __slots__ = ("data", "key", "node", "tokens", "used")

    def __init__(self, key, tokens: list[int], data, node: _Node, used: int):
        self.key, self.tokens, self.data, self.node, self.used = key, tokens, data, node, used


class PromptStore:
    """Prompt states by control-vector key and tokens, at most `max_bytes` of them (the module's
    docstring); `hits`, `misses` and `reused_tokens` count every prompt the engine opens."""

    def __init__(self, max_bytes: int, token_bytes: int = 1):
        self.max_bytes = max_bytes
        self.token_bytes = max(1, token_bytes)  # KV bytes per token: the bound in tokens, for /metrics
        self._roots: dict[object, _Node] = {}
        self._states: set[State] = set()
        self._clock = itertools.count()
        self.bytes = self.tokens = 0
        self.hits = self.misses = self.reused_tokens = self.restored = 0

    # lookups -----------------------------------------------------------------------
    def longest(self, key, prompt_ids: list[int]) -> tuple[int, State | None]:
        """The longest stored prefix of `prompt_ids` under `key`, in whole grid cells and
        leaving at least one token to prefill (its logits), and the state to restore it from
        (the most recently used one holding it); (0, None) when none."""
        node = self._walk(key, prompt_ids[: len(prompt_ids) - 1])
        if node is None or node.depth == 0:
            return 0, None
        return node.depth * PREFILL_GRID, self._newest_below(node)

    def holds(self, key, tokens: list[int]) -> bool:
        """Whether a stored state restores all of `tokens` (whole grid cells)."""
        node = self._walk(key, tokens)
        return node is not None and node.depth == len(tokens) // PREFILL_GRID and node.held > 0

    def _walk(self, key, ids: list[int]) -> _Node | None:
        """The deepest node along `ids`' whole cells that some state holds."""
        node = self._roots.get(key)
        if node is None:
            return None
        for start in range(0, len(ids) - PREFILL_GRID + 1, PREFILL_GRID):
            child = node.children.get(tuple(ids[start : start + PREFILL_GRID]))
            if child is None:
                break
            node = child
        return node

    def _newest_below(self, node: _Node) -> State:
        best, stack = None, [node]
        while stack:
            n = stack.pop()
            if n.state is not None and (best is None or n.state.used > best.used):
                best = n.state
            stack.extend(n.children.values())
        return best

    # changes -----------------------------------------------------------------------
    def served(self, reused: int, restored: State | None = None) -> None:
        """A prompt reused `reused` tokens (0: none), from a slot's cells or `restored` from here."""
        self.hits += reused > 0
        self.misses += reused == 0
        self.reused_tokens += reused
        if restored is not None:
            restored.used = next(self._clock)
            self.restored += 1

    def put(self, key, tokens: list[int], data) -> bool:
        """Keep `data` (llama.cpp's bytes of a slot's cells of `tokens`, whole grid cells) unless a
        stored state already holds them or they alone pass the bound; states it extends are
        dropped (it restores their prefixes too). True when kept."""
        cells = len(tokens) // PREFILL_GRID
        if cells == 0 or len(tokens) != cells * PREFILL_GRID or len(data) > self.max_bytes:
            return False
        if self.holds(key, tokens):
            return False
        node, path = self._roots.setdefault(key, _Node(None)), []
        for start in range(0, len(tokens), PREFILL_GRID):
            cell = tuple(tokens[start : start + PREFILL_GRID])
            node = node.children.get(cell) or node.children.setdefault(cell, _Node(node, cell))
            path.append(node)
        state = State(key, list(tokens), data, node, next(self._clock))
        node.state = state
        self._states.add(state)
        self._count(node, 1)
        self.bytes += len(data)
        self.tokens += len(tokens)
        for shorter in [n.state for n in path[:-1] if n.state is not None]:  # prompts this one extends
            self._drop(shorter)
        while self.bytes > self.max_bytes:
            self._drop(min(self._states, key=self._eviction_order))
        return state in self._states

    def _eviction_order(self, state: State) -> tuple[bool, int]:
        """States whose first cell another state shares go first (their head stays held), then
        the last holders of a head; the least recently used first within each."""
        node = state.node
        while node.parent is not None and node.parent.depth > 0:
            node = node.parent
        return (node.held < 2, state.used)

    def _drop(self, state: State) -> None:
        node = state.node
        node.state = None
        self._states.discard(state)
        self._count(node, -1)
        self.bytes -= len(state.data)
        self.tokens -= len(state.tokens)
        while node.parent is not None and node.held == 0 and not node.children:  # prune the empty branch
            del node.parent.children[node.cell]
            node = node.parent
        if node.parent is None and node.held == 0:
            del self._roots[state.key]

    @staticmethod
    def _count(node: _Node | None, delta: int) -> None:
        while node is not None:
            node.held += delta
            node = node.parent

    def stats(self) -> dict:
        """What /metrics shows (the engine actor's status carries it), as the transformers
        engine's prefix cache shows its own: `hits` and `reused_tokens` count every prompt
        that reused a prefix (a slot's own or a restored one), `restored` those restored from here."""
        return {
            "max_tokens": self.max_bytes // self.token_bytes,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "entries": len(self._states),
            "hits": self.hits,
            "misses": self.misses,
            "reused_tokens": self.reused_tokens,
            "restored": self.restored,
        }
