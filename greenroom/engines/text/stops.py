"""The one stop-sequence matcher, shared by every engine.

Text arrives in arbitrary pieces (a stop string may span several tokens), so the
matcher holds back the longest tail that could still begin a stop string and
releases it only once it cannot.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str]):
        self._stops = tuple(s for s in stops if s)
        self._buf = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add text; return what is safe to emit. After a match, `matched` is set and
        the returned text is everything before the stop string."""
        if not self._stops:
            return text
        self._buf += text
        first = -1
        for stop in self._stops:
            i = self._buf.find(stop)
            if i != -1 and (first == -1 or i < first):
                first, self.matched = i, stop
        if first != -1:
            out, self._buf = self._buf[:first], ""
            return out
        keep = self._partial_tail()
        out = self._buf[: len(self._buf) - keep]
        self._buf = self._buf[len(self._buf) - keep :]
        return out

    def flush(self) -> str:
        """The held-back tail, when generation ended for another reason."""
        out, self._buf = self._buf, ""
        return out

    def _partial_tail(self) -> int:
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(stop[:k]):
                    best = k
                    break
        return best
