"""Chat prompt rendering shared by every engine with a chat template."""

from __future__ import annotations

import json
from collections.abc import Callable

from .tool_calls import HERMES, LLAMA3_JSON

# the template's own rendering: (messages, add_generation_prompt, tools, template variables) → text
Apply = Callable[[list[dict], bool, "list[dict] | None", "dict | None"], str]

_PROBE = {
    "type": "function",
    "function": {
        "name": "greenroom_tool_probe",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


class ChatTemplate:
    """A model's chat rendering. A template that never shows the model its tools (SmolLM2's,
    Gemma's: found as minja does, by rendering a probe tool and looking for its name) gets
    them described in the system message instead, with the Hermes `<tool_call>` syntax the
    tool-call parser reads — as llama.cpp's server polyfills such templates — so a request
    with tools is honoured on every model, never silently answered without them.

    `tool_syntax` is how the model writes a call (tool_calls.HERMES or LLAMA3_JSON), read from
    the template's `source` where it is given (`tool_syntax`); what a required or named call
    is constrained to."""

    def __init__(self, apply: Apply, source: str | None = None):
        self._apply = apply
        try:
            self.renders_tools = _PROBE["function"]["name"] in apply(
                [{"role": "user", "content": "x"}], True, [_PROBE], None
            )
        except Exception:  # a template that cannot take tools at all
            self.renders_tools = False
        self.tool_syntax = tool_syntax(source, self.renders_tools)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
        generation_prompt: bool = True,
    ) -> str:
        """The conversation as the model's prompt: with the generation prompt (a trailing
        assistant message continued: `render_conversation`), or without it, as it stands."""
        if tools and not self.renders_tools:
            messages, tools = described_tools(messages, tools), None
        if not generation_prompt:
            return self._apply(messages, False, tools, template_kwargs)
        return render_conversation(lambda msgs, gen: self._apply(msgs, gen, tools, template_kwargs), messages)


def tool_syntax(source: str | None, renders_tools: bool = True) -> str:
    """The call syntax a chat template teaches, found in its source as llama.cpp's server
    (`--jinja`, common/chat.cpp) finds a template's family: `<tool_call>` is Hermes/Qwen's;
    Llama 3.x's templates have an `ipython` role (and `<|python_tag|>`) and teach
    `{"name": ..., "parameters": ...}`. A template that renders no tools is given the Hermes
    description (`described_tools`), and a family not recognised is served in Hermes's, the
    syntax greenroom describes where it must."""
    if not source or not renders_tools or "<tool_call>" in source:
        return HERMES
    if (
        "<|start_header_id|>" in source
        and ("ipython" in source or "<|python_tag|>" in source)
        and '"parameters"' in source
    ):
        return LLAMA3_JSON
    return HERMES


_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


def described_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The conversation for a template without tools: the tools in the (first) system
    message, an assistant's calls written out in its content, tool results as user turns."""
    listing = _TOOLS_HEAD + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + _TOOLS_TAIL
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{listing}".lstrip()
    else:
        out.insert(0, {"role": "system", "content": listing})
    for m in out:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [_call_text(c) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(filter(None, [m.get("content") or "", *calls]))
        elif m.get("role") == "tool":
            m["role"], m["content"] = "user", f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
    return out


def _call_text(call: dict) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return f"<tool_call>\n{json.dumps({'name': fn.get('name'), 'arguments': args}, ensure_ascii=False)}\n</tool_call>"


# thought blocks a reasoning template may open in its generation prompt → their closing tag
THOUGHT_TAGS = {"<think>": "</think>"}
# a lone partial answer is rendered as this, and the template's text cut where it stands
_PARTIAL = "\ue000greenroom-partial\ue000"


def render_conversation(apply_template: Callable[[list[dict], bool], str], messages: list[dict]) -> str:
    """`apply_template(messages, add_generation_prompt)` renders a conversation.

    A trailing assistant message is a partial answer to continue (a client's Continue
    action): everything before it is rendered with the generation prompt and the
    partial is appended raw, so the model resumes mid-sentence instead of starting a
    new turn that the template would otherwise open after a closed one. When that
    generation prompt opens a thought block (reasoning templates), the block is not
    opened twice: a partial that brings its own opening tag replaces the template's,
    and a partial with no thought at all is an answer, so the block is closed empty
    before it.

    A partial with nothing before it (a client continuing a bare prefix; Open WebUI's Continue
    once truncation left only the answer) is rendered as the template renders that one message,
    cut where its content begins — vLLM's continue_final_message — since a template cannot
    render an empty conversation."""
    last = messages[-1]
    if last.get("role") != "assistant" or not isinstance(last.get("content"), str) or last.get("tool_calls"):
        return apply_template(messages, True)
    partial = last["content"]
    if len(messages) == 1:
        rendered = apply_template([{**last, "content": _PARTIAL}], False)
        if _PARTIAL not in rendered:
            raise ValueError("the chat template does not render the assistant message's content")
        head = prompt = rendered[: rendered.rindex(_PARTIAL)]
    else:
        head = apply_template(messages[:-1], True)
        prompt = head.removeprefix(apply_template(messages[:-1], False))
    for opening, closing in THOUGHT_TAGS.items():
        at = prompt.rfind(opening)
        if at < 0 or closing in prompt[at:]:
            continue
        if partial.lstrip().startswith(opening):
            head = head[: len(head) - len(prompt) + at]
        elif closing not in partial:
            head = head + ("" if head.endswith("\n") else "\n") + closing + "\n\n"
    return head + partial
