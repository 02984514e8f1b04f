"""The steering management API: SAEs attached per model (list, attach, detach) and the live
steering values (read, replace). JSON under /api/, beside Ollama's routes, with OpenAI's
error envelope like the rest of greenroom's own API.

Every write goes to the steering coordinator (the only writer, which persists it and
versions it); the state it answers is then pushed to each engine actor holding the model.
Each answer carries the state's `version` and `live`: whether every loaded placement of the
model now holds that version (false while the model is not loaded, or its actor restarts:
the tree pushes the state again when it is back).
"""

from __future__ import annotations

import math
import re

from quart import Quart, request

from greenroom.engines.base import STRENGTH_MAX
from greenroom.engines.demo_model import SIZES
from greenroom.engines.demo_sae import demo_sae_layers
from greenroom.errors import GreenroomError
from greenroom.http import openai_params
from greenroom.supervisor.tree import Tree

PATHS = frozenset({"/api/saes", "/api/saes/attach", "/api/saes/detach", "/api/steering"})
SAE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def register(app: Quart, tree: Tree) -> None:
    @app.get("/api/saes")
    async def saes():
        """The SAEs attached to each steerable model, and the demo SAEs `attach` can build."""
        return {"models": [await _answer(tree, model, await tree.steering("get", model)) for model in _steerable(tree)],
                "available": [{"sae": f"demo:{size}:{layer}", "model_size": size, "layer": layer}
                              for size in SIZES for layer in demo_sae_layers(size)]}

    @app.post("/api/saes/attach")
    async def attach():
        body = await _body({"model", "sae", "layer", "sae_id"})
        model = tree.resolve(openai_params.model_name(body))
        sae = body.get("sae")
        if not isinstance(sae, str) or not sae:
            raise GreenroomError("missing_parameter" if sae is None else "invalid_parameter",
                                 "'sae' must be a directory holding an SAELens SAE or demo:<size>[:<layer>]", "sae")
        layer = body.get("layer")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2**31):
            raise GreenroomError("invalid_parameter", "'layer' must be a non-negative integer", "layer")
        return await _write(tree, "attach", model, sae=sae, layer=layer, sae_id=_sae_id(body, required=False))

    @app.post("/api/saes/detach")
    async def detach():
        body = await _body({"model", "sae_id"})
        model = tree.resolve(openai_params.model_name(body))
        return await _write(tree, "detach", model, sae_id=_sae_id(body, required=True))

    @app.get("/api/steering")
    async def steering():
        return {"models": [await _answer(tree, model, await tree.steering("get", model))
                           for model in _steerable(tree)]}

    @app.put("/api/steering")
    async def set_steering():
        body = await _body({"model", "enabled", "strengths"})
        model = tree.resolve(openai_params.model_name(body))
        enabled = body.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise GreenroomError("invalid_parameter", "'enabled' must be true or false", "enabled")
        return await _write(tree, "set", model, enabled=enabled, strengths=_strengths(body.get("strengths")))


def _steerable(tree: Tree) -> list[str]:
    return [model for model, replicas in tree.replicas.items()
            if all(m.placement["engine"] == "transformers" for m in replicas)]


async def _write(tree: Tree, op: str, model: str, **args) -> dict:
    state = await tree.steering(op, model, **args)
    live = True
    for m in tree.replicas_of(model):
        live = await tree.push_steering(m, state) and live
    return {**state, "live": live}


async def _answer(tree: Tree, model: str, state: dict) -> dict:
    return {**state, "live": await tree.steering_live(model, state)}


async def _body(allowed: set[str]) -> dict:
    body = openai_params.parse_json(await request.get_data())
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise GreenroomError("invalid_parameter", f"unknown field(s): {', '.join(unknown)}", unknown[0])
    return body


def _sae_id(body: dict, required: bool) -> str | None:
    sae_id = body.get("sae_id")
    if sae_id is None and not required:
        return None
    if sae_id is None:
        raise GreenroomError("missing_parameter", "you must provide sae_id", "sae_id")
    if not isinstance(sae_id, str) or not SAE_ID.match(sae_id):
        raise GreenroomError("invalid_parameter", "'sae_id' must be 1–64 letters, digits, '_', '.' or '-'", "sae_id")
    return sae_id


def _strengths(value) -> dict | None:
    """{sae_id: {feature: strength}}: the shape and the ±200 range here; which SAEs are
    attached and how wide they are, the coordinator checks."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(f, dict) for f in value.values()):
        raise GreenroomError("invalid_parameter", "'strengths' must be an object {sae_id: {feature: strength}}",
                             "strengths")
    for sae_id, features in value.items():
        for feature, strength in features.items():
            where = f"strengths.{sae_id}.{feature}"
            if not (feature.isascii() and feature.isdigit()):
                raise GreenroomError("invalid_feature_index", f"feature {feature!r} of SAE {sae_id!r} is not a "
                                     "feature index (a non-negative integer)", where)
            if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
                raise GreenroomError("invalid_parameter", f"the strength of {where} must be a number", where)
            if abs(strength) > STRENGTH_MAX:
                raise GreenroomError("invalid_parameter", f"the strength of {where} is {strength}: strengths are "
                                     f"in ±{STRENGTH_MAX:g}", where)
    return value
