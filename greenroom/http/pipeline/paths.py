"""Where a translated request's fields came from: a surface translated into a ChatRequest
(Responses, Anthropic's Messages, Needle; request.py) names, for each location of the request it made,
the location in its own request it came from — so that a refusal of the chat request, before
the answer or in its stream, names the field the client sent."""

from __future__ import annotations

import contextlib
import string

import attrs

from greenroom.errors import GreenroomError

_WORD = frozenset(string.ascii_letters + string.digits + "_")


@attrs.frozen
class FieldPaths:
    """Chat location → the surface's (`messages[3]` → `input[2]`). A location under a named one
    is renamed with it (`messages[3].content[1]` → `input[2].content[1]`); one named by neither
    is the same on both surfaces."""

    names: dict[str, str] = attrs.field(factory=dict)

    def foreign(self, path: str) -> str:
        """`path` renamed by its longest named prefix."""
        for chat in sorted(self.names, key=len, reverse=True):
            if path.startswith(chat) and path[len(chat) : len(chat) + 1] in ("", ".", "["):
                return self.names[chat] + path[len(chat) :]
        return path

    def renamed(self, exc: GreenroomError) -> GreenroomError:
        """`exc` in the surface's names: its param, and each mention of a named location in its
        message. An error that names no field (an invalid document, a lost engine) is about the
        answer, not the request: its message may quote the answer's own keys, and is left as it is."""
        if exc.param is None or not self.names:
            return exc
        return GreenroomError(exc.code, self._mentions(exc.message), self.foreign(exc.param))

    @contextlib.contextmanager
    def renaming(self):
        """Refusals raised inside, renamed."""
        try:
            yield
        except GreenroomError as exc:
            renamed = self.renamed(exc)
            if renamed is exc:
                raise
            raise renamed from None

    def _mentions(self, text: str) -> str:
        """Each whole mention of a named location renamed, in one pass, longest first: replacing
        names one after another would rename a name already renamed (a system prompt shifts
        `messages[1]` to `messages[0]`, itself a chat location)."""
        chats = sorted(self.names, key=len, reverse=True)
        out, i = [], 0
        while i < len(text):
            if i == 0 or text[i - 1] not in _WORD and text[i - 1] not in "./":  # not inside a name or a pointer
                chat = next(
                    (c for c in chats if text.startswith(c, i) and text[i + len(c) : i + len(c) + 1] not in _WORD), None
                )
                if chat is not None:
                    out.append(self.names[chat])
                    i += len(chat)
                    continue
            out.append(text[i])
            i += 1
        return "".join(out)


def tools(count: int, fields: dict[str, str]) -> dict[str, str]:
    """The locations of `count` tools translated into chat's function tools, `fields` the
    surface's key → the function's (structured.translated_tools)."""
    out = {}
    for i in range(count):
        out[f"tools[{i}].function"] = f"tools[{i}]"
        out |= {f"tools[{i}].function.{chat}": f"tools[{i}].{own}" for own, chat in fields.items() if own != chat}
    return out


def message(chat: int, own: str) -> dict[str, str]:
    """A chat message made of one text field of the surface's (a system prompt, a query): the
    message and its content are that field."""
    return {f"messages[{chat}]": own, f"messages[{chat}].content": own}
