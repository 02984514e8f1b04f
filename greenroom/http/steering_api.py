"""The steering management API: SAEs attached per model (list, attach, detach), the live
steering values (read, replace) and profiles (named strengths for one model: create, read,
update, delete, activate, export, import). JSON under /api/, beside Ollama's routes, with
OpenAI's error envelope like the rest of greenroom's own API.

This module owns the routes, the checks of request shapes (names, descriptions, strength maps
within ±200), the JSON of a model's state (`state_json`) and a chat request's own steering and
headers (`request_steering`, `live_headers`); what depends on the SAEs attached is the
coordinator's. Every write goes to the steering coordinator (the only writer, which persists it
and versions it); the state it answers is then pushed to each engine actor holding the model.
Each answer carries the state's `version` and `live`: whether every loaded placement of the
model now holds that version (false while the model is not loaded, or its actor restarts:
the tree pushes the state again when it is back).
"""

from __future__ import annotations

import json
import math
import re

import attrs
from quart import Quart, request

from greenroom.actors import steering_rules as rules
from greenroom.engines.base import STRENGTH_MAX
from greenroom.engines.demo_model import SIZES
from greenroom.engines.demo_sae import demo_sae_layers
from greenroom.errors import GreenroomError
from greenroom.http import openai_params
from greenroom.protocol import (
    ActivateProfile, AttachSAE, CreateProfile, DeleteProfile, DetachSAE, Generate, GetProfile, GetSteering,
    ImportProfile, ListProfiles, LockSteering, ModelRequest, ResolveRequestSteering, SetSteering, SteeringState,
    UnlockSteering, UpdateProfile,
)
from greenroom.supervisor.tree import Tree

PATHS = frozenset({"/api/saes", "/api/saes/attach", "/api/saes/detach", "/api/steering", "/api/steering/lock"})
PROFILES = "/api/profiles"
DOCUMENTS = ("/api/clusters", "/api/circuits")  # http/clusters_api.py
SAE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PROFILE_NAME = SAE_ID
DESCRIPTION_MAX = 4096
EXPORT_FORMAT = "greenroom.steering_profile.v1"
# the SAE identity fields an export carries (steering_bases.SAE_IDENTITY), with their JSON types
_SAE_FIELDS = {"sae_id": str, "source": str, "layer": int, "hook_point": str, "width": int, "d_in": int,
               "architecture": str}


def owns(path: str) -> bool:
    """Whether `path` is one of these routes (OpenAI's error envelope, not Ollama's)."""
    return path in PATHS or any(path == root or path.startswith(root + "/") for root in (PROFILES, *DOCUMENTS))


def register(app: Quart, tree: Tree) -> None:
    @app.get("/api/saes")
    async def saes():
        """The SAEs attached to each steerable model, and the demo SAEs `attach` can build."""
        return {"models": [await _answer(tree, model) for model in tree.steerable()],
                "available": [{"sae": f"demo:{size}:{layer}", "model_size": size, "layer": layer}
                              for size in SIZES for layer in demo_sae_layers(size)]}

    @app.post("/api/saes/attach")
    async def attach():
        body = await read_body({"model", "sae", "layer", "sae_id"})
        model = tree.resolve(openai_params.model_name(body))
        sae = body.get("sae")
        if not isinstance(sae, str) or not sae:
            raise GreenroomError("missing_parameter" if sae is None else "invalid_parameter",
                                 "'sae' must be a directory holding an SAELens SAE, demo:<size>[:<layer>] or "
                                 "random:<d_in>:<layer>", "sae")
        layer = body.get("layer")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2**31):
            raise GreenroomError("invalid_parameter", "'layer' must be a non-negative integer", "layer")
        return await write(tree, AttachSAE(model, sae, layer, _sae_id(body, required=False)))

    @app.post("/api/saes/detach")
    async def detach():
        body = await read_body({"model", "sae_id"})
        model = tree.resolve(openai_params.model_name(body))
        return await write(tree, DetachSAE(model, _sae_id(body, required=True)))

    @app.get("/api/steering")
    async def steering():
        return {"models": [await _answer(tree, model) for model in tree.steerable()]}

    @app.put("/api/steering")
    async def set_steering():
        body = await read_body({"model", "enabled", "strengths"})
        model = tree.resolve(openai_params.model_name(body))
        enabled = body.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise GreenroomError("invalid_parameter", "'enabled' must be true or false", "enabled")
        return await write(tree, SetSteering(model, enabled, _strengths(body.get("strengths"))))

    @app.get("/api/steering/lock")
    async def steering_lock():
        return {"model": tree.locked_model}

    @app.put("/api/steering/lock")
    async def lock_steering():
        """Lock the server to one steerable model: /v1/models then lists it alone."""
        body = await read_body({"model"})
        return attrs.asdict(await tree.steering(LockSteering(tree.resolve(openai_params.model_name(body)))))

    @app.delete("/api/steering/lock")
    async def unlock_steering():
        return attrs.asdict(await tree.steering(UnlockSteering()))

    @app.get(PROFILES)
    async def profiles():
        return (await tree.steering(ListProfiles())).body

    @app.post(PROFILES)
    async def create_profile():
        body = await read_body({"name", "model", "description", "strengths"})
        model = tree.resolve(openai_params.model_name(body))
        return (await tree.steering(CreateProfile(model, check_name(body.get("name")),
                                                  check_description(body.get("description")) or "",
                                                  _strengths(body.get("strengths")) or {}))).body

    @app.get(PROFILES + "/<name>")
    async def profile(name: str):
        return (await tree.steering(GetProfile(name))).body

    @app.put(PROFILES + "/<name>")
    async def update_profile(name: str):
        body = await read_body({"description", "strengths"})
        description, strengths = check_description(body.get("description")), _strengths(body.get("strengths"))
        model = (await tree.steering(GetProfile(name))).body["model"]
        return (await tree.steering(UpdateProfile(model, name, description, strengths))).body

    @app.delete(PROFILES + "/<name>")
    async def delete_profile(name: str):
        return (await tree.steering(DeleteProfile(name))).body

    @app.post(PROFILES + "/<name>/activate")
    async def activate_profile(name: str):
        """The profile's strengths become the model's live steering, as PUT /api/steering writes them."""
        model = (await tree.steering(GetProfile(name))).body["model"]
        return await write(tree, ActivateProfile(model, name))

    @app.get(PROFILES + "/<name>/export")
    async def export_profile(name: str):
        profile = (await tree.steering(GetProfile(name))).body
        return {"format": EXPORT_FORMAT,
                "profile": {k: profile[k] for k in ("name", "model", "description", "strengths")},
                "saes": profile["saes"]}

    @app.post(PROFILES + "/import")
    async def import_profile():
        """A document GET …/export wrote; refused unless its SAEs are attached to the model as
        they were (the coordinator compares identities and checks widths)."""
        body = await read_body({"format", "profile", "saes"})
        if body.get("format") != EXPORT_FORMAT:
            raise GreenroomError("invalid_parameter", f"'format' must be {EXPORT_FORMAT!r} (an exported profile)",
                                 "format")
        profile, saes = body.get("profile"), body.get("saes")
        if not isinstance(profile, dict):
            raise GreenroomError("missing_parameter" if profile is None else "invalid_parameter",
                                 "'profile' must be an object {name, model, description, strengths}", "profile")
        unknown = sorted(set(profile) - {"name", "model", "description", "strengths"})
        if unknown:
            raise GreenroomError("invalid_parameter", f"unknown field(s): {', '.join(unknown)}", f"profile.{unknown[0]}")
        if not isinstance(saes, list) or not all(
                isinstance(sae, dict) and set(sae) == set(_SAE_FIELDS)
                and all(isinstance(sae[k], t) and not isinstance(sae[k], bool) for k, t in _SAE_FIELDS.items())
                for sae in saes):
            raise GreenroomError("missing_parameter" if saes is None else "invalid_parameter",
                                 f"'saes' must list the SAEs the profile refers to, each {{{', '.join(_SAE_FIELDS)}}}",
                                 "saes")
        model = tree.resolve(openai_params.model_name(profile))
        strengths = _strengths(profile.get("strengths")) or {}
        listed = {sae["sae_id"] for sae in saes}
        for sae_id in strengths:
            if sae_id not in listed:
                raise GreenroomError("invalid_parameter", f"SAE {sae_id!r} has strengths but is not in 'saes'",
                                     f"strengths.{sae_id}")
        return (await tree.steering(ImportProfile(model, check_name(profile.get("name")),
                                                  check_description(profile.get("description")) or "", strengths,
                                                  saes))).body


async def request_steering(tree: Tree, body: dict, gen: Generate) -> tuple[Generate, dict[str, str]]:
    """`gen` with its own steering when the chat request names a `profile` or sends a
    `steering_intensity` (spec: "Per-request steering with profile", "Intensity coupling"),
    resolved by the coordinator (404 profile_not_found, 400 when invalid for the attached SAEs),
    and the response headers: X-miLLM-Steering-Intensity echoing the resolved λ and
    X-miLLM-Circuit-Rung while a circuit genuinely steers (each omitted as the spec lists).
    Any other generation is served by the live state; its rung is the coordinator's last word."""
    name, dial = body.get("profile"), intensity(body.get("steering_intensity"))
    if name is not None and (not isinstance(name, str) or not name):
        raise GreenroomError("invalid_parameter", "'profile' must be a steering profile's name", "profile")
    if name is None and dial is None:
        return gen, live_headers(tree, gen.model)
    resolved = await tree.steering(ResolveRequestSteering(gen.model, name, dial))
    headers = {}
    if resolved.intensity is not None:
        headers["X-miLLM-Steering-Intensity"] = rules.intensity_header(resolved.intensity)
    if resolved.rung is not None:
        headers["X-miLLM-Circuit-Rung"] = rules.rung_header(resolved.rung)
    return attrs.evolve(gen, request_strengths=resolved.strengths), headers


def live_headers(tree: Tree, model: str) -> dict[str, str]:
    """X-miLLM-Circuit-Rung of a request the live state steers: while the model's active
    circuit genuinely steers (the coordinator's last `serving` says so with a rung)."""
    state = tree.last_steering_states.get(model)
    serving = (state.serving if state is not None else None) or {}
    return {"X-miLLM-Circuit-Rung": rules.rung_header(serving["rung"])} if "rung" in serving else {}


def intensity(value) -> float | str | None:
    """steering_intensity: a λ in [0, 2] or "off" / "min" / "max"; anything else is a 400."""
    if value is None:
        return None
    if isinstance(value, str) and value in rules.SYMBOLS:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and rules.ENVELOPE[0] <= value <= rules.ENVELOPE[1]):
        raise GreenroomError("invalid_parameter", "'steering_intensity' must be a number from 0 to 2, or \"off\", "
                             f"\"min\" or \"max\" (got {json.dumps(value)})", "steering_intensity")
    return float(value)


async def write(tree: Tree, request: ModelRequest) -> dict:
    """A steering write answered with the model's state, once pushed to its engine actors."""
    state = await tree.steering(request)
    return state_json(state, await tree.push_model_steering(state.model, state))


async def _answer(tree: Tree, model: str) -> dict:
    state = await tree.steering(GetSteering(model))
    return state_json(state, await tree.steering_live(model, state))


def state_json(state: SteeringState, live: bool) -> dict:
    """A model's state as every route answers it, with `live`."""
    return {**attrs.asdict(state), "live": live}


async def read_body(allowed: set[str]) -> dict:
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


def check_name(name) -> str:
    if name is None:
        raise GreenroomError("missing_parameter", "you must provide name", "name")
    if not isinstance(name, str) or not PROFILE_NAME.match(name):
        raise GreenroomError("invalid_parameter", "'name' must be 1–64 letters, digits, '_', '.' or '-'", "name")
    return name


def check_description(value) -> str | None:
    if value is not None and (not isinstance(value, str) or len(value) > DESCRIPTION_MAX):
        raise GreenroomError("invalid_parameter", f"'description' must be a string of at most {DESCRIPTION_MAX} "
                             "characters", "description")
    return value


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
