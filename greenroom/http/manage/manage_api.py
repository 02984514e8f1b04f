"""greenroom's management API (JSON beside Ollama's /api routes): models — list with
states, load, unload — and the inference backend of each engine actor. Errors use
OpenAI's envelope, as the rest of greenroom's own API does."""

from __future__ import annotations

from quart import Quart, request

from greenroom.errors import GreenroomError
from greenroom.http.core import routes
from greenroom.http.core.contracts import Shape
from greenroom.http.openai import openai_params
from greenroom.supervisor.tree import Tree

MODEL = Shape(fields={"model": openai_params.MODEL}, required=("model",), closed=True)  # load and unload


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "GET", "/api/models")
    async def models():
        return {"models": tree.models()}

    @routes.view(app, "POST", "/api/models/load")
    async def load():
        model = await _model()
        await tree.load(model)
        return _row(tree, model)

    @routes.view(app, "POST", "/api/models/unload")
    async def unload():
        model = await _model()
        await tree.unload(model)
        return _row(tree, model)

    @routes.view(app, "GET", "/api/health/inference")
    async def inference():
        """The configured backend, and each engine actor's as it reports it (null while it is not up)."""
        rows = []
        for slot in tree.slots.values():
            if slot.role == "engine":
                status = await slot.client.status() if slot.client is not None else None
                rows.append(
                    {"name": slot.name, "state": slot.state, "backend": None, **(status or {}).get("inference", {})}
                )
        return {"backend": "continuous_batching" if tree.config.continuous_batching else "serial", "actors": rows}


async def _model() -> str:
    body = openai_params.parse_json(await request.get_data())
    unknown = sorted(set(body) - MODEL.names)
    if unknown:
        raise GreenroomError("invalid_parameter", f"unknown field(s): {', '.join(unknown)}", unknown[0])
    return openai_params.model_name(body)


def _row(tree: Tree, model: str) -> dict:
    return next(m for m in tree.models() if m["id"] == model)
