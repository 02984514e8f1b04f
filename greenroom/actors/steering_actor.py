"""The steering coordinator: the one writer of the steering state (store/steering.py).

It serves one session stream, like every actor. Each `SteeringCommand` is run to the end
before the next is read, so writes are serialised here and every change gets the next
version; the answer is the model's resulting state (`SteeringSnapshot`) or a typed
`Failed`. The front end pushes the state it answers to the engine actors (`SteerUpdate`).
An SAE is loaded once here to be checked (files, width, hook, fit to the model) before it
is recorded, so an engine actor never receives one it cannot attach.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import attrs
import trio

from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    Events, Failed, SteeringCommand, SteeringSnapshot, Status, StatusQuery, from_wire, to_wire,
)
from greenroom.store.steering import ModelSteering, SteeringStore



@tractor.context
async def steering_session(ctx, parent_pid: int, cache_dir: str | None):
    die_with_parent(parent_pid)
    store = SteeringStore(cache_dir)
    await ctx.started({"ok": True, "models": []})
    async with ctx.open_stream() as stream:
        async for raw in stream:
            msg = from_wire(raw)
            if isinstance(msg, StatusQuery):
                status = {"pid": os.getpid(), "role": "steering", "models": [], "queue_depth": 0}
                await stream.send(to_wire(Events([Status(msg.rid, status)])))
            elif isinstance(msg, SteeringCommand):
                try:  # SQLite and SAE files are blocking: off the loop, which keeps answering status
                    state = await trio.to_thread.run_sync(run_command, store, cache_dir, msg)
                    reply = SteeringSnapshot(msg.rid, state if isinstance(state, dict) else attrs.asdict(state))
                except GreenroomError as exc:
                    reply = Failed(msg.rid, exc.to_wire())
                await stream.send(to_wire(Events([reply])))


def run_command(store: SteeringStore, cache_dir: str | None, cmd: SteeringCommand) -> ModelSteering | dict:
    if cmd.op.startswith("profile_"):
        return _profile_command(store, cmd.op, cmd.model, cmd.args)
    state = store.get(cmd.model)
    args = cmd.args
    if cmd.op == "get" or (cmd.op == "default" and state.version > 0):
        return state
    if cmd.op in ("attach", "default"):
        record = _resolve_sae(cache_dir, args["sae"], args.get("layer"), args.get("sae_id"), args["placement"])
        for other in state.saes:
            if other["sae_id"] == record["sae_id"]:
                raise GreenroomError("invalid_parameter", f"an SAE named {record['sae_id']!r} is already attached to "
                                     f"{cmd.model!r}; detach it or choose another sae_id", "sae_id")
            if other["block"] == record["block"]:
                raise GreenroomError("invalid_parameter", f"block {record['block']} of {cmd.model!r} already has SAE "
                                     f"{other['sae_id']!r} attached (one SAE per block)", "sae")
        return store.put(attrs.evolve(state, saes=[*state.saes, record]))
    if cmd.op == "detach":
        sae_id = args["sae_id"]
        _attached(state, sae_id, "sae_id")
        return store.put(attrs.evolve(state, saes=[s for s in state.saes if s["sae_id"] != sae_id],
                                      strengths={k: v for k, v in state.strengths.items() if k != sae_id}))
    if cmd.op == "set":
        strengths = state.strengths if args.get("strengths") is None else _strengths(state, args["strengths"])
        enabled = state.enabled if args.get("enabled") is None else bool(args["enabled"])
        return store.put(attrs.evolve(state, enabled=enabled, strengths=strengths))
    raise GreenroomError("invalid_parameter", f"unknown steering command {cmd.op!r}")


# what names an SAE wherever it is attached: an imported profile's SAEs must match on these
SAE_IDENTITY = ("sae_id", "source", "layer", "hook_point", "width", "d_in", "architecture")
_SAME_SAE = ("layer", "hook_point", "width", "d_in", "architecture")  # the source's path may differ per machine


def _profile_command(store: SteeringStore, op: str, model: str, args: dict) -> ModelSteering | dict:
    """The profile ops; the model a profile steers is the one it was created (or imported) for."""
    if op == "profile_list":
        return {"profiles": store.profiles()}
    name = args["name"]
    if op in ("profile_create", "profile_import"):
        if store.profile(name) is not None:
            raise GreenroomError("profile_exists", f"a profile named {name!r} exists; update or delete it", "name")
        state = store.get(model)
        for i, sae in enumerate(args.get("saes", ())):  # an import: the SAEs it was made with must be attached
            held = _attached(state, sae["sae_id"], f"saes[{i}]")
            differs = [k for k in _SAME_SAE if sae[k] != held[k]]
            if differs:
                raise GreenroomError("sae_not_attached", f"SAE {sae['sae_id']!r} attached to {state.model!r} is not "
                                     f"the document's: its {', '.join(differs)} differ", f"saes[{i}]")
        now = int(time.time())
        profile = {"name": name, "model": state.model, "description": args["description"], "created_at": now}
        return _put_profile(store, state, profile, args["strengths"])
    profile = store.profile(name)
    if profile is None:
        raise GreenroomError("profile_not_found", f"no steering profile named {name!r}",
                             "profile" if op == "profile_request" else "name")
    if op == "profile_get":
        return profile
    if op == "profile_request":  # a chat request's profile, for that request only: nothing is written
        return {"strengths": _request_strengths(store.get(model), profile)}
    if op == "profile_delete":
        store.delete_profile(name)
        return {"name": name, "deleted": True}
    state = store.get(profile["model"])
    if op == "profile_update":
        if args.get("description") is not None:
            profile["description"] = args["description"]
        if args.get("strengths") is None:  # kept as stored, even if an SAE it names was detached since
            profile["updated_at"] = int(time.time())
            store.put_profile(profile)
            return profile
        return _put_profile(store, state, profile, args["strengths"])
    if op == "profile_activate":  # the profile's strengths as the model's live state: a steering write
        return store.put(attrs.evolve(state, strengths=_strengths(state, profile["strengths"], "strengths")))
    raise GreenroomError("invalid_parameter", f"unknown steering command {op!r}")


def _request_strengths(state: ModelSteering, profile: dict) -> dict[str, dict[str, float]]:
    """The profile's strengths checked against the SAEs attached to the request's model now
    (the spec: no SAE attached → the request runs unsteered; a profile invalid for them → 400)."""
    if not state.saes:
        return {}
    if profile["model"] != state.model:
        raise GreenroomError("invalid_parameter", f"profile {profile['name']!r} steers model {profile['model']!r}, "
                             f"not {state.model!r}", "profile")
    for sae in profile["saes"]:
        held = _attached(state, sae["sae_id"], "profile")
        differs = [k for k in _SAME_SAE if sae[k] != held[k]]
        if differs:
            raise GreenroomError("sae_not_attached", f"SAE {sae['sae_id']!r} attached to {state.model!r} is not the "
                                 f"one profile {profile['name']!r} was made with: its {', '.join(differs)} differ",
                                 "profile")
    return _strengths(state, profile["strengths"], "profile")


def _put_profile(store: SteeringStore, state: ModelSteering, profile: dict, strengths: dict) -> dict:
    """Store `profile` with `strengths` checked against the SAEs attached now, and their identities."""
    strengths = _strengths(state, strengths)
    saes = [{k: sae[k] for k in SAE_IDENTITY} for sae in state.saes if sae["sae_id"] in strengths]
    profile = {**profile, "strengths": strengths, "saes": saes, "updated_at": int(time.time())}
    store.put_profile(profile)
    return profile


def _attached(state: ModelSteering, sae_id: str, param: str) -> dict:
    for sae in state.saes:
        if sae["sae_id"] == sae_id:
            return sae
    raise GreenroomError("sae_not_attached", f"no SAE named {sae_id!r} is attached to {state.model!r} (attached: "
                         f"{[s['sae_id'] for s in state.saes]})", param)


def _strengths(state: ModelSteering, strengths: dict, param: str | None = None) -> dict[str, dict[str, float]]:
    """The new strengths (their values checked by the front end, http/steering_api.py), checked
    against the attached SAEs' widths; zeros are dropped (a
    zero steers nothing), so clearing a feature and never setting it read the same. `param`:
    what a refusal names instead of the request's strengths (a stored profile's are not sent)."""
    out = {}
    for sae_id, features in strengths.items():
        width = _attached(state, sae_id, param or f"strengths.{sae_id}")["width"]
        for feature, strength in features.items():
            if not (feature.isdigit() and int(feature) < width):
                raise GreenroomError("invalid_feature_index", f"feature {feature!r} is outside SAE {sae_id!r} "
                                     f"(width {width}: features 0–{width - 1})",
                                     param or f"strengths.{sae_id}.{feature}")
        live = {str(int(f)): float(s) for f, s in features.items() if s}
        if live:
            out[sae_id] = live
    return out


def _resolve_sae(cache_dir: str | None, source: str, layer: int | None, sae_id: str | None,
                 placement: dict) -> dict:
    """The record of SAE `source` ("demo:<size>[:<layer>]" or a directory) for the model
    placed at `placement`, after loading it and checking that the model can take it."""
    from greenroom.engines.demo_model import default_cache_dir
    from greenroom.engines.demo_sae import ensure_demo_sae
    from greenroom.engines.loader import source_path
    from greenroom.engines.sae import SAEFormatError, load_sae  # torch: only once an SAE is attached

    try:
        if source.startswith("demo:"):
            size, _, named = source[len("demo:"):].partition(":")
            if named and layer is not None and int(named) != layer:
                raise ValueError(f"{source!r} names layer {named}, the request layer {layer}")
            layer = int(named) if named else layer
            path = ensure_demo_sae(default_cache_dir(cache_dir), size, layer)
            default_id = f"sae_demo_{size}_l{path.name.removeprefix('layer-')}"
        else:
            path = Path(source).expanduser().resolve()
            default_id = "sae_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{path.parent.name}_{path.name}").strip("_")
        sae = load_sae(path)
    except (SAEFormatError, OSError, ValueError) as exc:
        raise GreenroomError("invalid_sae", f"{source!r} is not an SAE greenroom can load: {exc}", "sae") from None
    if layer is not None and sae.layer != layer:
        raise GreenroomError("invalid_sae", f"{source!r} reads layer {sae.layer} ({sae.hook_name}), not layer {layer}",
                             "layer")
    try:
        config = json.loads((source_path(placement["source"], placement.get("cache_dir")) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}  # not built yet: the engine actor checks when it attaches
    width_in, blocks = config.get("hidden_size"), config.get("num_hidden_layers")
    if width_in is not None and sae.d_in != width_in:
        raise GreenroomError("invalid_sae", f"{source!r} reads {sae.d_in}-wide vectors; model {placement['id']!r}'s "
                             f"residual stream is {width_in} wide", "sae")
    if blocks is not None and not 0 <= sae.block < blocks:
        raise GreenroomError("invalid_sae", f"{source!r} hooks {sae.hook_name}; model {placement['id']!r} has "
                             f"{blocks} blocks", "sae")
    return {"sae_id": sae_id or default_id[:64], "source": source, "path": str(path), "layer": sae.layer,
            "block": sae.block, "hook_point": sae.hook_name, "width": sae.d_sae, "d_in": sae.d_in,
            "architecture": sae.architecture}
