"""Admission: a request's rows rendered or tokenised and checked against the model — the
vocabulary, the context window, each row's max_tokens resolved, a prompt with a Fit cut by
Ollama's rule (engines/prompt_fit.py), a seed drawn for a request sent without one where its
lane reproduces seeds — before anything is computed, so that every refusal comes before
`Admitted` (a plain 400, never a broken stream). Runs in the engine actor's
worker thread (engine_actor.py), which raises what these raise as the request's typed error.
"""

from __future__ import annotations

import secrets

import attrs

from greenroom.engines.base import SEED_MAX, SamplingParams, context_length_exceeded
from greenroom.errors import GreenroomError
from greenroom.protocol import Admitted, Embed, Generate, Score, Tokenize


def admit(
    engine, req: Generate, default_max_tokens: int, seeded: bool
) -> tuple[list[list[int]], list[SamplingParams], Admitted]:
    """Validate and tokenise every row (each row's params, max_tokens resolved) — a row
    with a Fit cut to its window by Ollama's rule — and the Admitted that announces it.
    `seeded`: the lane the request runs in reproduces a seed (the engine's seeds are measured
    to, and its draws are the request's own); there a request sent without a seed runs with one
    drawn now, which Admitted reports, so that any answer can be reproduced."""
    rows, names = _rows(engine, req)
    if req.conversations is None:
        for ids, name in zip(rows, names):
            _check_ids(engine, ids, name, "prompt")
    fitted = None
    if req.fit is not None:
        fitted, params = _fitted(engine, req, rows[0])
        rows = [fitted.ids]
    else:  # a constrained document is ended by its grammar, not cut by the server's default
        params = [
            _resolve_max_tokens(
                engine, ids, req.params, name, default_max_tokens, whole_room=req.constraint is not None
            )
            for ids, name in zip(rows, names)
        ]
    as_is = req.conversations is not None and not engine.has_chat_template
    drawn = secrets.randbelow(SEED_MAX + 1) if seeded and req.params.seed is None else None
    if drawn is not None:
        params = [attrs.evolve(p, seed=drawn) for p in params]
    chars = None  # a text completion's logprobs count text_offset from the prompt's start, as scoring's do
    if req.params.logprobs is not None and req.conversations is None:
        chars = [len(p) for p in req.prompts] if req.prompts is not None else [len(engine.decode(i)) for i in rows]
    admitted = Admitted(
        req.rid, sum(len(ids) for ids in rows), fitted and fitted.truncated, as_is, drawn_seed=drawn, prompt_chars=chars
    )
    return rows, params, admitted


def score_rows(engine, req: Score) -> tuple[list[list[int]], list[str]]:
    """Each row's prompt ids and name, every row leaving room for the one token scored (an
    echo with max_tokens 0 scores none: its prompt may fill the window)."""
    if req.conversations is not None and not engine.has_chat_template:
        raise GreenroomError(
            "no_chat_template",
            f"model {req.model!r} has no chat template: chat scoring "
            "would score a prompt the model was never trained on; use /v1/completions",
        )
    rows, names = _rows(engine, req)
    for ids, name in zip(rows, names):
        if not ids:
            raise GreenroomError(
                "invalid_scoring_request",
                f"{name} tokenises to nothing: there is no position to score",
                name.split("[")[0],
            )
        outside = [t for t in ids if not 0 <= t < engine.vocab_size]
        if outside:
            raise GreenroomError(
                "invalid_scoring_request",
                f"{name} has token ids outside the vocabulary (0–{engine.vocab_size - 1}): {outside[:5]}",
                name.split("[")[0],
            )
        if len(ids) + req.next_token > engine.info.context_length:
            raise context_length_exceeded(
                engine.info.context_length,
                f"you requested {len(ids) + req.next_token} "
                f"tokens ({len(ids)} in the {name}, {int(req.next_token)} in the completion)",
                name,
            )
    return rows, names


def embed_rows(engine, req: Embed) -> list[list[int]]:
    """Each input's ids, within the window and the vocabulary."""
    if req.token_ids is not None:
        rows = req.token_ids
    else:  # in one call where the engine's tokenizer takes many texts at once (OpenVINO's: 20× faster)
        many = getattr(engine, "tokenize_many", None)
        rows = many(req.texts) if many else [engine.tokenize(t) for t in req.texts]
    limit = engine.info.context_length
    for i, ids in enumerate(rows):
        where = "input" if len(rows) == 1 else f"input[{i}]"
        if len(ids) > limit:
            raise context_length_exceeded(limit, f"you requested {len(ids)} tokens in {where}", "input", "input")
        _check_ids(engine, ids, where, "input")
    return rows


def tokenized(engine, req: Tokenize) -> list[int]:
    """A Tokenize's ids: the token ids sent (inside the vocabulary), the conversation rendered as
    a chat request's (no chat template: no_chat_template), or the prompt tokenised."""
    if req.token_ids is not None:
        if req.token_ids:
            _check_ids(engine, req.token_ids, "tokens", "tokens")
        return req.token_ids
    if req.conversation is not None:
        return _renderer(engine, req, "messages")(req.conversation)
    return engine.tokenize(req.prompt, add_special_tokens=req.add_special_tokens)


def _resolve_max_tokens(
    engine, prompt_ids: list[int], params: SamplingParams, where: str, default_max_tokens: int, whole_room: bool = False
) -> SamplingParams:
    limit = engine.info.context_length
    room = limit - len(prompt_ids)
    if params.max_tokens is None:
        if room <= 0:
            raise context_length_exceeded(
                limit, f"your {where} resulted in {len(prompt_ids)} tokens", where.split("[")[0]
            )
        return attrs.evolve(params, max_tokens=room if whole_room else min(default_max_tokens, room))
    if len(prompt_ids) + params.max_tokens > limit:
        raise context_length_exceeded(
            limit,
            f"you requested {len(prompt_ids) + params.max_tokens} tokens "
            f"({len(prompt_ids)} in the {where}, {params.max_tokens} in the completion)",
            "max_tokens",
            f"{where} or completion",
        )
    return params


def _fitted(engine, req: Generate, ids: list[int]):
    """The row fitted by Ollama's rule (engines/prompt_fit.py) and its params: the answer
    gets num_predict tokens, or the rest of the window, and never passes the window."""
    from greenroom.engines.prompt_fit import answer_room, fit_conversation, fit_ids

    fit = req.fit
    window = min(fit.window, engine.info.context_length)
    target = window - answer_room(window, fit.answer)
    # an engine may take shorter prompts than its window (the NPU pipeline's static shapes)
    target = min(target, getattr(engine, "max_prompt_len", None) or target)
    if req.conversations is not None and len(ids) > target:
        fitted = fit_conversation(_renderer(engine, req, "messages"), req.conversations[0], target, fit.keep)
    else:
        fitted = fit_ids(ids, target, fit.keep)
    room = window - len(fitted.ids)
    return fitted, [attrs.evolve(req.params, max_tokens=room if fit.fill else min(fit.answer, room))]


def _rows(engine, req: Generate | Score) -> tuple[list[list[int]], list[str]]:
    """Each row's prompt ids and its name in the request: conversations rendered with the
    chat template (a failing one is named by its index), prompts tokenised."""
    if req.conversations is not None:
        names = ["messages"] + [f"extra_messages[{i}]" for i in range(len(req.conversations) - 1)]
        return [_renderer(engine, req, name)(c) for c, name in zip(req.conversations, names)], names
    rows = req.prompt_token_ids or [engine.tokenize(p, add_special_tokens=req.add_special_tokens) for p in req.prompts]
    return rows, ["prompt"] if len(rows) == 1 else [f"prompt[{i}]" for i in range(len(rows))]


def _renderer(engine, req: Generate | Score | Tokenize, name: str):
    """messages → prompt ids, by the model's chat template; a model without one refuses
    (no_chat_template), or renders the last message as it is where the request says so
    (Ollama's `{{ .Prompt }}` on /api/generate)."""
    if not engine.has_chat_template:
        if getattr(req, "as_is_without_template", False):
            return lambda messages: engine.tokenize(messages[-1].get("content") or "")
        raise GreenroomError(
            "no_chat_template",
            f"model {req.model!r} has no chat template, so a conversation "
            "cannot be rendered for it: give its [[models]] entry a chat_template, or send a plain "
            "prompt (/v1/completions; /api/generate renders a prompt as it is)",
            name,
        )

    def render(messages: list[dict]) -> list[int]:
        try:
            return engine.render_chat(messages, req.template_kwargs, req.tools, getattr(req, "generation_prompt", True))
        except Exception as exc:  # a template error names the conversation it came from
            raise GreenroomError(
                "invalid_parameter", f"{name} cannot be rendered with the model's chat template: {exc}", name
            ) from None

    return render


def _check_ids(engine, ids: list[int], where: str, param: str) -> None:
    if not ids:
        raise GreenroomError("invalid_parameter", f"{where} is empty", param)
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise GreenroomError(
            "invalid_parameter",
            f"{where} has token ids outside the vocabulary (0–{engine.vocab_size - 1}): {bad[:5]}",
            param,
        )
