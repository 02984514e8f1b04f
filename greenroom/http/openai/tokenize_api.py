"""vLLM's /tokenize and /detokenize, on every engine: the engine actor owns the tokenizer, so
each is one `Tokenize` message (protocol.py), answered between decode steps.

/tokenize takes a `prompt` (tokenised as /v1/completions tokenises one) or `messages` (with
`tools`, rendered as chat completions render them, generation prompt included) and answers
{"count", "max_model_len", "tokens", "token_strs"}; /detokenize takes `tokens` and answers
{"prompt"}.
"""

from __future__ import annotations

from quart import Quart

from greenroom.errors import GreenroomError
from greenroom.http.core import ledger, routes
from greenroom.http.core.contracts import Boolean, ListOf, Number, Shape, Text, refused, sent
from greenroom.http.core.objects import COUNT, TEXT, Object, or_null
from greenroom.http.openai import openai_params
from greenroom.http.pipeline import generation, structured
from greenroom.http.pipeline.answering import single
from greenroom.protocol import Tokenize, Tokenized
from greenroom.supervisor.tree import Tree

TOKENIZED = Object(
    name="Tokenized",
    fields={
        "count": COUNT,
        "max_model_len": Number(integer=True, lo=0, description="The model's context window"),
        "tokens": ListOf(items=COUNT),
        "token_strs": or_null(ListOf(items=TEXT)),
    },
)
DETOKENIZED = Object(name="Detokenized", fields={"prompt": TEXT})
OBJECTS = (TOKENIZED, DETOKENIZED)


def tokenized_answer(answer: Tokenized) -> dict:
    return TOKENIZED.build(
        count=len(answer.tokens),
        max_model_len=answer.context_length,
        tokens=answer.tokens,
        token_strs=answer.token_strs,
    )


TOKENIZE = Shape(
    fields={
        "model": openai_params.MODEL,
        "prompt": Text(description="A prompt, tokenised as /v1/completions tokenises one (no chat template)"),
        "add_special_tokens": Boolean(default=True, description="For a prompt: false, tokenised as written (no BOS)"),
        "messages": openai_params.MESSAGES,
        "tools": ListOf(items=structured.TOOL, description="Rendered with messages, as chat completions render them"),
        "chat_template_kwargs": openai_params.CHAT.fields["chat_template_kwargs"],
        "add_generation_prompt": Boolean(
            default=True,
            description="For messages: false, the conversation as it stands (no assistant turn opened after it)",
        ),
        "return_token_strs": Boolean(default=False, description="true: each token's own text too (token_strs)"),
        "chat_template": refused(why="the model's own chat template (or its config's chat_template) renders"),
    },
    required=("model",),
    rules=({"oneOf": [sent("prompt"), sent("messages")], "description": "prompt or messages (one of the two)"},),
    ledger=True,
)
DETOKENIZE = Shape(
    fields={
        "model": openai_params.MODEL,
        "tokens": ListOf(items=Number(lo=0, hi=openai_params.INT32_MAX, integer=True)),
    },
    required=("model", "tokens"),
    ledger=True,
)


async def tokenized(tree: Tree, message: Tokenize) -> Tokenized:
    """The engine's answer to `message` (its model loaded first if it is not)."""
    client, _ = await tree.client_for(message.model)
    return await single(client, message)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "POST", "/tokenize")
    async def tokenize():
        req = await generation.prepare(tree, TOKENIZE, "on tokenize")
        body = req.body
        strings = openai_params.boolean(body, "return_token_strs", False)
        if (body.get("prompt") is None) == (body.get("messages") is None):
            raise GreenroomError("invalid_parameter", "send a prompt or messages (one of the two)", "prompt")
        rid = openai_params.new_rid("tokenize")
        # validated whichever is sent, so a bad value is a 400 even where it is not read
        tools = structured.plan(structured.Output(tools=body.get("tools"))).tools
        template_kwargs = openai_params.template_kwargs(body)
        if body.get("messages") is not None:
            unread = ["add_special_tokens"] if body.get("add_special_tokens") is not None else []
            message = Tokenize(
                rid,
                req.model,
                conversation=openai_params.messages(body),
                tools=tools,
                template_kwargs=template_kwargs,
                generation_prompt=openai_params.boolean(body, "add_generation_prompt", True),
                token_strs=strings,
            )
        else:
            unread = [f for f in ("tools", "chat_template_kwargs", "add_generation_prompt") if body.get(f) is not None]
            message = Tokenize(
                rid,
                req.model,
                prompt=openai_params.string(body, "prompt"),
                add_special_tokens=openai_params.boolean(body, "add_special_tokens", True),
                token_strs=strings,
            )
        headers = ledger.report_headers(req.ignored + unread, req.strict)
        answer = await tokenized(tree, message)
        return tokenized_answer(answer), 200, headers

    @routes.view(app, "POST", "/detokenize")
    async def detokenize():
        req = await generation.prepare(tree, DETOKENIZE, "on detokenize")
        tokens = req.body.get("tokens")
        if tokens is None:
            raise GreenroomError("missing_parameter", "'tokens' is a required property", "tokens")
        if not (isinstance(tokens, list) and all(DETOKENIZE.fields["tokens"].items.holds(t) for t in tokens)):
            raise GreenroomError(
                "invalid_parameter", "'tokens' must be an array of token ids (integers from 0)", "tokens"
            )
        headers = req.headers()
        answer = await tokenized(tree, Tokenize(openai_params.new_rid("detokenize"), req.model, token_ids=tokens))
        return DETOKENIZED.build(prompt=answer.text), 200, headers
