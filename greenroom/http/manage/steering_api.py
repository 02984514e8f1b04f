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

import attrs
from quart import Quart, request

from greenroom import steering_rules as rules
from greenroom.engines.base import STRENGTH_MAX
from greenroom.engines.demo.demo_model import SIZES
from greenroom.engines.demo.demo_sae import demo_sae_layers
from greenroom.errors import GreenroomError
from greenroom.http.core import routes
from greenroom.http.core.contracts import INT64, AnyOf, Boolean, Choice, ListOf, MapOf, Number, Shape, Text, needs
from greenroom.http.core.headers import CIRCUIT_RUNG_HEADER, STEERING_INTENSITY_HEADER
from greenroom.http.openai import openai_params
from greenroom.protocol import (
    ActivateProfile,
    ActiveCircuit,
    AttachSAE,
    CircuitSummary,
    ConvertStrengths,
    CreateProfile,
    DeleteCircuit,
    DeleteCluster,
    DeleteProfile,
    DescribeSAE,
    DetachSAE,
    Generate,
    GetProfile,
    GetSteering,
    ImportProfile,
    ListProfiles,
    LockSteering,
    Member,
    ModelRequest,
    ResolveRequestSteering,
    SetSteering,
    SteeringDocument,
    SteeringState,
    UnlockSteering,
    UpdateProfile,
)
from greenroom.supervisor.tree import Tree

DESCRIPTION_MAX = 4096
EXPORT_FORMAT = "greenroom.steering_profile.v1"

# --- request shapes (contracts.py) --------------------------------------------------------

SAE_ID = Text(pattern="[A-Za-z0-9_.-]{1,64}")
PROFILE_NAME = SAE_ID
DESCRIPTION = Text(max_length=DESCRIPTION_MAX)
STRENGTHS = MapOf(
    values=MapOf(values=Number(lo=-STRENGTH_MAX, hi=STRENGTH_MAX), keys=Text(pattern="[0-9]+")),
    description=f"Per attached SAE (by sae_id), feature index → strength in ±{STRENGTH_MAX:g}: a "
    "percentage of the layer's typical residual norm added along the feature's unit decoder direction "
    "(docs/architecture.md)",
)
# a strength as a request gives it: a number in the spec's scale, or a SAELens coefficient
COEFFICIENT = Shape(
    fields={
        "coefficient": Number(
            description="A SAELens/Neuronpedia coefficient: coefficient × the feature's decoder row is added. "
            "Converted to the spec's scale and stored so (strength = 100 × coefficient × decoder_norm[i] / "
            f"residual_norm: GET /api/saes/{{sae_id}}), where it must land within ±{STRENGTH_MAX:g}; it needs the "
            "SAE's residual norm measured (its model loaded once)"
        )
    },
    required=("coefficient",),
    closed=True,
)
GIVEN_STRENGTHS = attrs.evolve(
    STRENGTHS,
    values=attrs.evolve(STRENGTHS.values, values=AnyOf(options=(STRENGTHS.values.values, COEFFICIENT))),
    description=f"Per attached SAE (by sae_id), feature index → strength: a number in ±{STRENGTH_MAX:g} (a "
    "percentage of the layer's typical residual norm added along the feature's unit decoder direction, "
    'docs/architecture.md), or {"coefficient": c} in SAELens\' unit',
)
MODEL = openai_params.MODEL
ATTACH = Shape(
    fields={
        "model": MODEL,
        "sae": Text(
            min_length=1,
            description="A directory holding an SAELens SAE (cfg.json + sae_weights.safetensors), "
            "demo:<size>[:<layer>], or random:<d_in>:<layer> (random directions)",
        ),
        "layer": Number(
            lo=0, hi=2**31 - 1, integer=True, description="The layer the SAE must read (a demo SAE: which one)"
        ),
        "sae_id": attrs.evolve(SAE_ID, description="Its name (default: derived from the source)"),
    },
    required=("model", "sae"),
    closed=True,
)
DETACH = Shape(fields={"model": MODEL, "sae_id": SAE_ID}, required=("model", "sae_id"), closed=True)
SET = Shape(
    fields={
        "model": MODEL,
        "enabled": Boolean(),
        "strengths": attrs.evolve(
            GIVEN_STRENGTHS,
            description="Replaces every strength of the model ({} clears them); zeros "
            "are dropped. Left out: the strengths stay. " + GIVEN_STRENGTHS.description,
        ),
    },
    required=("model",),
    closed=True,
)
LOCK = Shape(fields={"model": MODEL}, required=("model",), closed=True)
PROFILE = Shape(
    fields={
        "name": PROFILE_NAME,
        "model": MODEL,
        "description": DESCRIPTION,
        "strengths": attrs.evolve(
            GIVEN_STRENGTHS,
            description="Checked against the SAEs attached to the model now (default {}). "
            + GIVEN_STRENGTHS.description,
        ),
    },
    required=("name", "model"),
    closed=True,
)
UPDATE = Shape(
    fields={
        "description": DESCRIPTION,
        "strengths": attrs.evolve(
            GIVEN_STRENGTHS,
            description="Replaces the profile's strengths; left out: they stay. " + GIVEN_STRENGTHS.description,
        ),
    },
    closed=True,
)
# the SAE identity fields an export carries (steering_bases.SAE_IDENTITY)
_INT = Number(lo=INT64[0], hi=INT64[1], integer=True)
SAE_IDENTITY = Shape(
    fields={
        "sae_id": Text(),
        "source": Text(),
        "layer": _INT,
        "hook_point": Text(),
        "width": _INT,
        "d_in": _INT,
        "architecture": Text(),
    },
    required=("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture"),
    closed=True,
)
EXPORTED = Shape(
    fields={
        "format": Choice(values=(EXPORT_FORMAT,)),
        "profile": attrs.evolve(PROFILE, description="Its strengths name only SAEs of `saes`"),
        "saes": ListOf(
            items=SAE_IDENTITY,
            description="The identities of the SAEs the strengths refer to: an import needs "
            "each attached to the model (same layer, hook point, width, d_in, architecture)",
        ),
    },
    required=("format", "profile", "saes"),
    closed=True,
)
# a chat request's own steering (request_steering)
CHAT = Shape(
    fields={
        "profile": Text(
            min_length=1,
            description="A steering profile (/api/profiles) steering this request only, on the "
            "serial path; the live steering is unchanged. 404 profile_not_found; 400 when invalid for the "
            "attached SAEs; no SAE attached: unsteered. Served on transformers and GGUF models; refused on text "
            "completions, scoring requests and OpenVINO models. See [Per-request profile](steering.md#per-request-profile) "
            "and [Per-request intensity](steering.md#per-request-intensity-steering_intensity)",
            rule=needs("profile"),
        ),
        "steering_intensity": AnyOf(
            options=(Number(lo=rules.ENVELOPE[0], hi=rules.ENVELOPE[1]), Choice(values=rules.SYMBOLS)),
            description=(
                'A steering dial for this request only: a λ in 0–2, or "off", "min" or "max". It scales the base (the '
                "named profile, else the model's active profile, cluster or circuit, else the live values) by the spec's "
                "intensity rules (clusters: capped at the declared range's top, else the server's maximum; circuits: "
                'clamped into the declared range at both ends); 0/"off" turns steering off. The resolved λ is echoed in '
                + STEERING_INTENSITY_HEADER
            ),
            rule=needs("steering"),
        ),
    }
)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "GET", "/api/saes")
    async def saes():
        """The SAEs attached to each steerable model, and the demo SAEs `attach` can build."""
        return {
            "models": [await _answer(tree, model) for model in tree.steerable()],
            "available": [
                {"sae": f"demo:{size}:{layer}", "model_size": size, "layer": layer}
                for size in SIZES
                for layer in demo_sae_layers(size)
            ],
        }

    @routes.view(app, "GET", "/api/saes/{sae_id}")
    async def sae(sae_id: str):
        """One attached SAE (`?model=` while several models have one of that name): its record,
        what a strength means there (residual_norm, decoder norms, coefficient_per_strength)
        and ‖W_dec[i]‖ for every feature."""
        model, _ = await attached(tree, sae_id, request.args.get("model"))
        described = await tree.steering(DescribeSAE(model, sae_id))
        return {"model": model, **described.sae, "decoder_norms": described.decoder_norms}

    @routes.view(app, "POST", "/api/saes/attach")
    async def attach():
        body = await read_body(ATTACH)
        model = tree.resolve(openai_params.model_name(body))
        sae = body.get("sae")
        if not isinstance(sae, str) or not sae:
            raise GreenroomError.wrong(
                sae,
                "'sae' must be a directory holding an SAELens SAE, demo:<size>[:<layer>] or random:<d_in>:<layer>",
                "sae",
            )
        layer = body.get("layer")
        if layer is not None and not ATTACH.fields["layer"].holds(layer):
            raise GreenroomError("invalid_parameter", "'layer' must be a non-negative integer", "layer")
        return await write(tree, AttachSAE(model, sae, layer, _sae_id(body, required=False)))

    @routes.view(app, "POST", "/api/saes/detach")
    async def detach():
        body = await read_body(DETACH)
        model = tree.resolve(openai_params.model_name(body))
        return await write(tree, DetachSAE(model, _sae_id(body, required=True)))

    @routes.view(app, "GET", "/api/steering")
    async def steering():
        return {"models": [await _answer(tree, model) for model in tree.steerable()]}

    @routes.view(app, "PUT", "/api/steering")
    async def set_steering():
        body = await read_body(SET)
        model = tree.resolve(openai_params.model_name(body))
        enabled = body.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise GreenroomError("invalid_parameter", "'enabled' must be true or false", "enabled")
        return await write(tree, SetSteering(model, enabled, await given_strengths(tree, model, body)))

    @routes.view(app, "GET", "/api/steering/lock")
    async def steering_lock():
        return {"model": tree.locked_model}

    @routes.view(app, "PUT", "/api/steering/lock")
    async def lock_steering():
        """Lock the server to one steerable model: /v1/models then lists it alone."""
        body = await read_body(LOCK)
        return attrs.asdict(await tree.steering(LockSteering(tree.resolve(openai_params.model_name(body)))))

    @routes.view(app, "DELETE", "/api/steering/lock")
    async def unlock_steering():
        return attrs.asdict(await tree.steering(UnlockSteering()))

    @routes.view(app, "GET", "/api/profiles")
    async def profiles():
        listed = document_json(await tree.steering(ListProfiles()))
        return {**listed, "profiles": [labelled(tree, profile) for profile in listed["profiles"]]}

    @routes.view(app, "POST", "/api/profiles")
    async def create_profile():
        body = await read_body(PROFILE)
        model = tree.resolve(openai_params.model_name(body))
        return document_json(
            await tree.steering(
                CreateProfile(model, *name_and_description(body), await given_strengths(tree, model, body) or {})
            )
        )

    @routes.view(app, "GET", "/api/profiles/{name}")
    async def profile(name: str):
        return labelled(tree, document_json(await tree.steering(GetProfile(name))))

    @routes.view(app, "PUT", "/api/profiles/{name}")
    async def update_profile(name: str):
        body = await read_body(UPDATE)
        description = check_description(body.get("description"))
        model = (await tree.steering(GetProfile(name))).model
        strengths = await given_strengths(tree, model, body)
        return document_json(await tree.steering(UpdateProfile(model, name, description, strengths)))

    @routes.view(app, "DELETE", "/api/profiles/{name}")
    async def delete_profile(name: str):
        return await delete(tree, DeleteProfile(name))

    @routes.view(app, "POST", "/api/profiles/{name}/activate")
    async def activate_profile(name: str):
        """The profile's strengths become the model's live steering, as PUT /api/steering writes them."""
        model = (await tree.steering(GetProfile(name))).model
        return await write(tree, ActivateProfile(model, name))

    @routes.view(app, "GET", "/api/profiles/{name}/export")
    async def export_profile(name: str):
        profile = document_json(await tree.steering(GetProfile(name)))
        return {
            "format": EXPORT_FORMAT,
            "profile": {k: profile[k] for k in ("name", "model", "description", "strengths")},
            "saes": profile["saes"],
        }

    @routes.view(app, "POST", "/api/profiles/import")
    async def import_profile():
        """A document GET …/export wrote; refused unless its SAEs are attached to the model as
        they were (the coordinator compares identities and checks widths)."""
        body = await read_body(EXPORTED)
        if body.get("format") != EXPORT_FORMAT:
            raise GreenroomError(
                "invalid_parameter", f"'format' must be {EXPORT_FORMAT!r} (an exported profile)", "format"
            )
        profile, saes = body.get("profile"), body.get("saes")
        if not isinstance(profile, dict):
            raise GreenroomError.wrong(
                profile, "'profile' must be an object {name, model, description, strengths}", "profile"
            )
        unknown = sorted(set(profile) - PROFILE.names)
        if unknown:
            raise GreenroomError(
                "invalid_parameter", f"unknown field(s): {', '.join(unknown)}", f"profile.{unknown[0]}"
            )
        if not isinstance(saes, list) or not all(
            isinstance(sae, dict)
            and sae.keys() == SAE_IDENTITY.names
            and all(_typed(field, sae[k]) for k, field in SAE_IDENTITY.fields.items())
            for sae in saes
        ):
            raise GreenroomError.wrong(
                saes,
                f"'saes' must list the SAEs the profile refers to, each {{{', '.join(SAE_IDENTITY.fields)}}}",
                "saes",
            )
        model = tree.resolve(openai_params.model_name(profile))
        strengths = await given_strengths(tree, model, profile) or {}
        listed = {sae["sae_id"] for sae in saes}
        for sae_id in strengths:
            if sae_id not in listed:
                raise GreenroomError(
                    "invalid_parameter", f"SAE {sae_id!r} has strengths but is not in 'saes'", f"strengths.{sae_id}"
                )
        return document_json(await tree.steering(ImportProfile(model, *name_and_description(profile), strengths, saes)))


async def request_steering(tree: Tree, profile, steering_intensity, gen: Generate) -> tuple[Generate, dict[str, str]]:
    """`gen` with its own steering when the chat request names a `profile` or sends a
    `steering_intensity` (spec: "Per-request steering with profile", "Intensity coupling"),
    resolved by the coordinator (404 profile_not_found, 400 when invalid for the attached SAEs),
    and the response headers: X-miLLM-Steering-Intensity echoing the resolved λ and
    X-miLLM-Circuit-Rung while a circuit genuinely steers (each omitted as the spec lists).
    Any other generation is served by the live state; its rung is the coordinator's last word."""
    name, dial = profile, intensity(steering_intensity)
    if name is not None and not CHAT.fields["profile"].matches(name):
        raise GreenroomError("invalid_parameter", "'profile' must be a steering profile's name", "profile")
    if name is None and dial is None:
        return gen, live_headers(tree, gen.model)
    resolved = await tree.steering(ResolveRequestSteering(gen.model, name, dial))
    headers = {}
    if resolved.intensity is not None:
        headers[STEERING_INTENSITY_HEADER] = rules.intensity_header(resolved.intensity)
    if resolved.rung is not None:
        headers[CIRCUIT_RUNG_HEADER] = rules.rung_header(resolved.rung)
    return attrs.evolve(gen, request_strengths=resolved.strengths), headers


def live_headers(tree: Tree, model: str) -> dict[str, str]:
    """X-miLLM-Circuit-Rung of a request the live state steers: while the model's active
    circuit genuinely steers (the coordinator's last `serving` says so with a rung)."""
    state = tree.last_steering_states.get(model)
    serving = (state.serving if state is not None else None) or {}
    return {CIRCUIT_RUNG_HEADER: rules.rung_header(serving["rung"])} if "rung" in serving else {}


def intensity(value) -> float | str | None:
    """steering_intensity: a λ in [0, 2] or "off" / "min" / "max"; anything else is a 400."""
    if value is None:
        return None
    symbols, dial = CHAT.fields["steering_intensity"].options[1], CHAT.fields["steering_intensity"].options[0]
    if isinstance(value, str) and value in symbols.values:
        return value
    if not (dial.holds(value) and math.isfinite(value)):
        raise GreenroomError(
            "invalid_parameter",
            f'\'steering_intensity\' must be a number from 0 to 2, or "off", "min" or "max" (got {json.dumps(value)})',
            "steering_intensity",
        )
    return float(value)


async def write(tree: Tree, request: ModelRequest) -> dict:
    """A steering write answered with the model's state, once pushed to its engine actors."""
    state = await tree.steering(request)
    live = await tree.push_model_steering(state.model, state)
    # an attach's push had the engine measure the SAE's residual norm: the record with it
    latest = tree.last_steering_states.get(state.model)
    return state_json(latest if latest is not None and latest.version == state.version else state, live)


async def delete(tree: Tree, request: DeleteProfile | DeleteCluster | DeleteCircuit) -> dict:
    """A deletion answered with the new state of the model that steered through the document
    (pushed to its engine actors), else `state: null`."""
    deleted = await tree.steering(request)
    state = deleted.state
    live = None if state is None else state_json(state, await tree.push_model_steering(state.model, state))
    return {"name": deleted.name, "deleted": True, "state": live}


async def _answer(tree: Tree, model: str) -> dict:
    state = await tree.steering(GetSteering(model))
    return state_json(state, await tree.steering_live(model, state))


def state_json(state: SteeringState, live: bool) -> dict:
    """A model's state as every route answers it, with `live`."""
    return {**attrs.asdict(state), "live": live}


def document_json(doc: SteeringDocument | ActiveCircuit) -> dict:
    """The coordinator's document as the routes answer it (the one place it becomes JSON): its
    fields in order, feature ids as the spec writes them (map keys as decimal strings, a
    member's `feature` a number), a member's missing label and an unparseable circuit's
    definition left out."""
    return _json(doc)


_DEFINITION = frozenset(f.name for f in attrs.fields(CircuitSummary)[7:])  # what an unparseable one lacks


def labelled(tree: Tree, profile: dict) -> dict:
    """A profile's answer with `labels`: the user's labels of the features its strengths name
    (PUT /api/saes/{sae_id}/features/{index}/label), where any is set."""
    labels = {}
    for sae_id, strengths in profile["strengths"].items():
        held = tree.dashboards.labels(profile["model"], sae_id)
        named = {feature: held[int(feature)] for feature in strengths if int(feature) in held}
        if named:
            labels[sae_id] = named
    return {**profile, "labels": labels} if labels else profile


def _json(value):
    if attrs.has(type(value)):
        out = {f.name: _json(getattr(value, f.name)) for f in attrs.fields(type(value))}
        if isinstance(value, Member) and value.label is None:
            del out["label"]
        if isinstance(value, CircuitSummary):
            out = {k: v for k, v in out.items() if k not in (_DEFINITION if value.unparseable else {"unparseable"})}
        return out
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _typed(field, value) -> bool:
    return field.typed(value) if isinstance(field, Number) else field.matches(value)


async def read_body(shape: Shape) -> dict:
    """The JSON body of a closed shape: a field it does not declare is refused."""
    body = openai_params.parse_json(await request.get_data())
    unknown = sorted(set(body) - shape.names)
    if unknown:
        raise GreenroomError("invalid_parameter", f"unknown field(s): {', '.join(unknown)}", unknown[0])
    return body


def _sae_id(body: dict, required: bool) -> str | None:
    sae_id = body.get("sae_id")
    if sae_id is None and not required:
        return None
    if sae_id is None:
        raise GreenroomError("missing_parameter", "you must provide sae_id", "sae_id")
    if not SAE_ID.matches(sae_id):
        raise GreenroomError("invalid_parameter", "'sae_id' must be 1–64 letters, digits, '_', '.' or '-'", "sae_id")
    return sae_id


def name_and_description(body: dict) -> tuple[str, str]:
    """A stored object's name and its description ("" when left out), each checked."""
    return check_name(body.get("name")), check_description(body.get("description")) or ""


def check_name(name) -> str:
    if name is None:
        raise GreenroomError("missing_parameter", "you must provide name", "name")
    if not PROFILE_NAME.matches(name):
        raise GreenroomError("invalid_parameter", "'name' must be 1–64 letters, digits, '_', '.' or '-'", "name")
    return name


def check_description(value) -> str | None:
    if value is not None and not DESCRIPTION.matches(value):
        raise GreenroomError(
            "invalid_parameter",
            f"'description' must be a string of at most {DESCRIPTION_MAX} characters",
            "description",
        )
    return value


def given_strength(value, where: str, nonzero: bool = False) -> tuple[bool, float]:
    """A strength as a request gives it — a number in ±200, or {"coefficient": c} (any finite
    non-zero-if-asked number) — as (whether it is a coefficient, its value); else a 400."""
    coefficient = isinstance(value, dict) and value.keys() == {"coefficient"}
    number = value["coefficient"] if coefficient else value
    if (
        isinstance(number, bool)
        or not isinstance(number, (int, float))
        or not math.isfinite(number)
        or (nonzero and number == 0)
        or (not coefficient and abs(number) > STRENGTH_MAX)
    ):
        kind = "a non-zero number" if nonzero else "a number"
        raise GreenroomError(
            "invalid_parameter",
            f"the strength of {where} must be {kind} within ±{STRENGTH_MAX:g}, or "
            f'{{"coefficient": c}} with c {kind} (got {json.dumps(value)})',
            where,
        )
    return coefficient, float(number)


async def in_percent(tree: Tree, model: str, given: dict, param: str | None = None) -> dict:
    """{sae_id: {feature: (is_coefficient, value)}} in the spec's scale: coefficients converted by
    the coordinator (strength_units.py: through the SAE's residual norm and decoder rows, ±200
    checked after); `param`: what a conversion's refusal names (None: each strength's place)."""
    coefficients = {sae: {f: v for f, (c, v) in features.items() if c} for sae, features in given.items()}
    coefficients = {sae: features for sae, features in coefficients.items() if features}
    converted = (await tree.steering(ConvertStrengths(model, coefficients, param))).strengths if coefficients else {}
    return {
        sae: {f: converted[sae][f] if c else v for f, (c, v) in features.items()} for sae, features in given.items()
    }


async def given_strengths(tree: Tree, model: str, body: dict) -> dict | None:
    """The body's `strengths` (each a number or {"coefficient": c}), checked, in percent."""
    value = _strengths(body.get("strengths"))
    return None if value is None else await in_percent(tree, model, value)


def _strengths(value) -> dict | None:
    """{sae_id: {feature: strength}} → {sae_id: {feature: (is_coefficient, value)}}: the shape
    and the ±200 range of percent strengths here; which SAEs are attached and how wide they are
    (and a coefficient's range), the coordinator checks."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(f, dict) for f in value.values()):
        raise GreenroomError(
            "invalid_parameter", "'strengths' must be an object {sae_id: {feature: strength}}", "strengths"
        )
    out = {}
    for sae_id, features in value.items():
        out[sae_id] = {}
        for feature, strength in features.items():
            where = f"strengths.{sae_id}.{feature}"
            if not STRENGTHS.values.keys.matches(feature):
                raise GreenroomError(
                    "invalid_feature_index",
                    f"feature {feature!r} of SAE {sae_id!r} is not a feature index (a non-negative integer)",
                    where,
                )
            out[sae_id][feature] = given_strength(strength, where)
    return out


async def attached(tree: Tree, sae_id: str, model: str | None) -> tuple[str, dict]:
    """The model SAE `sae_id` is attached to (`model`, a body's or a query's; left out, the only
    one with it) and the SAE's record: every route under /api/saes/{sae_id} reads it so."""
    if not SAE_ID.matches(sae_id):
        raise GreenroomError("invalid_parameter", "an sae_id is 1–64 letters, digits, '_', '.' or '-'", "sae_id")
    if model is not None:  # a body's was checked against its declaration; a query's any string
        candidates = [tree.resolve(model)]
        tree.require_steering(candidates[0])
    else:
        candidates = tree.steerable()
    found = []
    for name in candidates:
        for sae in (await tree.steering(GetSteering(name))).saes:
            if sae["sae_id"] == sae_id:
                found.append((name, sae))
    if not found:
        where = f"model {model!r}" if model is not None else "any model"
        raise GreenroomError("sae_not_attached", f"no SAE named {sae_id!r} is attached to {where}", "sae_id")
    if len(found) > 1:
        raise GreenroomError(
            "missing_parameter",
            f"SAE {sae_id!r} is attached to several models ({', '.join(m for m, _ in found)}): name one with "
            "'model' (in a query, ?model=)",
            "model",
        )
    return found[0]
