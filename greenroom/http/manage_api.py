"""greenroom's management API for models (JSON under /api/models, beside Ollama's routes):
list with states, load, unload. Errors use OpenAI's envelope, as the rest of greenroom's
own API does."""

from __future__ import annotations

from quart import Quart, request

from greenroom.errors import GreenroomError
from greenroom.http import openai_params
from greenroom.supervisor.tree import Tree

PATHS = frozenset({"/api/models", "/api/models/load", "/api/models/unload"})


def register(app: Quart, tree: Tree) -> None:
    @app.get("/api/models")
    async def models():
        return {"models": tree.models()}

    @app.post("/api/models/load")
    async def load():
        model = await _model()
        await tree.load(model)
        return _row(tree, model)

    @app.post("/api/models/unload")
    async def unload():
        model = await _model()
        await tree.unload(model)
        return _row(tree, model)


async def _model() -> str:
    body = openai_params.parse_json(await request.get_data())
    unknown = sorted(set(body) - {"model"})
    if unknown:
        raise GreenroomError("invalid_parameter", f"unknown field(s): {', '.join(unknown)}", unknown[0])
    return openai_params.model_name(body)


def _row(tree: Tree, model: str) -> dict:
    return next(m for m in tree.models() if m["id"] == model)
