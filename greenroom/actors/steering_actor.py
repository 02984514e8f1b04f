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
import logging
import os
import re
import time
from pathlib import Path

import attrs
import trio

from greenroom.actors import steering_bases as bases
from greenroom.actors import steering_rules as rules
from greenroom.actors.runtime import die_with_parent, tractor
from greenroom.errors import GreenroomError
from greenroom.protocol import (
    Events, Failed, SteeringCommand, SteeringSnapshot, Status, StatusQuery, from_wire, to_wire,
)
from greenroom.store.steering import ModelSteering, SteeringStore

log = logging.getLogger(__name__)


@tractor.context
async def steering_session(ctx, parent_pid: int, cache_dir: str | None, limits: dict):
    die_with_parent(parent_pid)
    store, limits = SteeringStore(cache_dir), rules.Limits(**limits)
    await ctx.started({"ok": True, "models": []})
    async with ctx.open_stream() as stream:
        async for raw in stream:
            msg = from_wire(raw)
            if isinstance(msg, StatusQuery):
                status = {"pid": os.getpid(), "role": "steering", "models": [], "queue_depth": 0}
                await stream.send(to_wire(Events([Status(msg.rid, status)])))
            elif isinstance(msg, SteeringCommand):
                try:  # SQLite and SAE files are blocking: off the loop, which keeps answering status
                    state = await trio.to_thread.run_sync(run_command, store, cache_dir, limits, msg)
                    reply = SteeringSnapshot(msg.rid, state)
                except GreenroomError as exc:
                    reply = Failed(msg.rid, exc.to_wire())
                except Exception as exc:  # a fault in one command: that command's 500, not the coordinator's end
                    log.exception("steering command %s failed", msg.op)
                    reply = Failed(msg.rid, GreenroomError("internal_error", f"steering command {msg.op!r} failed: "
                                                           f"{exc}").to_wire())
                await stream.send(to_wire(Events([reply])))


def run_command(store: SteeringStore, cache_dir: str | None, limits: rules.Limits, cmd: SteeringCommand) -> dict:
    """One command; a model's state comes back as `answer` makes it, anything else as the op's own dict."""
    op, args = cmd.op, cmd.args
    if op.startswith(("profile_", "cluster_")):
        return _profile_command(store, limits, op, cmd.model, args)
    if op.startswith("circuit_"):
        return _circuit_command(store, limits, op, cmd.model, args)
    if op == "lock_get":
        return {"model": store.setting(bases.LOCK)}
    if op == "lock_set":
        store.put_setting(bases.LOCK, cmd.model or None)
        return {"model": cmd.model or None}
    state = store.get(cmd.model)
    if op == "request":
        return bases.request(store, state, args.get("profile"), args.get("intensity"), limits)
    if op == "get" or (op == "default" and state.version > 0):
        return answer(store, state, limits)
    if op in ("attach", "default"):
        record = _resolve_sae(cache_dir, args["sae"], args.get("layer"), args.get("sae_id"), args["placement"])
        for other in state.saes:
            if other["sae_id"] == record["sae_id"]:
                raise GreenroomError("invalid_parameter", f"an SAE named {record['sae_id']!r} is already attached to "
                                     f"{cmd.model!r}; detach it or choose another sae_id", "sae_id")
            if other["block"] == record["block"]:
                raise GreenroomError("invalid_parameter", f"block {record['block']} of {cmd.model!r} already has SAE "
                                     f"{other['sae_id']!r} attached (one SAE per block)", "sae")
        return _put(store, limits, attrs.evolve(state, saes=[*state.saes, record]))
    if op == "detach":
        sae_id = args["sae_id"]
        bases.attached(state, sae_id, "sae_id")
        return _put(store, limits, attrs.evolve(state, saes=[s for s in state.saes if s["sae_id"] != sae_id],
                                                strengths={k: v for k, v in state.strengths.items() if k != sae_id}))
    if op == "set":  # values set directly replace the active base's; enabling alone keeps it
        if args.get("strengths") is not None:
            state = attrs.evolve(state, strengths=bases.checked(state, args["strengths"]), active=None)
        if args.get("enabled") is not None:
            state = attrs.evolve(state, enabled=bool(args["enabled"]))
        return _put(store, limits, state)
    raise GreenroomError("invalid_parameter", f"unknown steering command {op!r}")


def answer(store: SteeringStore, state: ModelSteering, limits: rules.Limits) -> dict:
    """A model's state as the front end receives it: the stored fields and `serving`, what the
    active base is and, while a circuit genuinely steers, its rung."""
    return {**attrs.asdict(state), "serving": bases.serving(store, state, limits)}


def _put(store: SteeringStore, limits: rules.Limits, state: ModelSteering) -> dict:
    """Store the next version of `state`, its live values re-derived from its active base (a
    circuit's bindings follow the SAEs attached)."""
    base = bases.active_base(store, state) if state.active is not None else None
    if base is not None and base.kind == "live":
        state = attrs.evolve(state, active=None)  # deleted since it was activated: the values stay, as set
    elif base is not None and base.kind != "profile":  # a plain profile's activation copied its values
        state = attrs.evolve(state, strengths=base.resolved(None, limits))
    return answer(store, store.put(state), limits)


def _activated(store: SteeringStore, limits: rules.Limits, state: ModelSteering, kind: str, name: str) -> dict:
    return _put(store, limits, attrs.evolve(state, active={"kind": kind, "name": name}))


def _profile_command(store: SteeringStore, limits: rules.Limits, op: str, model: str, args: dict) -> dict:
    """The profile and cluster ops; the model a profile steers is the one it was created (or
    imported) for. A cluster is a profile with an intensity range and a persistent dial."""
    if op == "profile_list":
        return {"profiles": store.profiles()}
    if op == "cluster_list":
        return {"clusters": [bases.cluster_summary(p, store) for p in store.profiles() if p.get("cluster")]}
    name = args["name"]
    if op in ("profile_create", "profile_import", "cluster_import"):
        if store.profile(name) is not None:
            raise GreenroomError("profile_exists", f"a profile or cluster named {name!r} exists; update or delete it",
                                 "name")
        state = store.get(model)
        for i, sae in enumerate(args.get("saes", ())):  # an import: the SAEs it was made with must be attached
            held = bases.attached(state, sae["sae_id"], f"saes[{i}]")
            differs = [k for k in bases.SAME_SAE if sae[k] != held[k]]
            if differs:
                raise GreenroomError("sae_not_attached", f"SAE {sae['sae_id']!r} attached to {state.model!r} is not "
                                     f"the document's: its {', '.join(differs)} differ", f"saes[{i}]")
        now = int(time.time())
        profile = {"name": name, "model": state.model, "description": args["description"], "created_at": now,
                   "cluster": None}
        if op != "cluster_import":
            return _put_profile(store, state, profile, args["strengths"])
        sae_id, cap = args["sae_id"], rules.cluster_bounds(args["intensity_range"], limits)[1]
        bases.attached(state, sae_id, "sae_id")
        _dial(args["intensity"], cap, "intensity")
        profile["cluster"] = {"sae_id": sae_id, "intensity": args["intensity"],
                              "intensity_range": args["intensity_range"], "labels": args["labels"]}
        return bases.cluster_summary(_put_profile(store, state, profile, {sae_id: args["members"]}, "members"), store)
    profile = store.profile(name)
    if profile is None or (op.startswith("cluster_") and not profile.get("cluster")):
        raise GreenroomError("profile_not_found", f"no steering {'cluster' if op.startswith('cluster_') else 'profile'}"
                             f" named {name!r}", "name")
    if op == "profile_get":
        return profile
    if op == "cluster_get":
        return bases.cluster_summary(profile, store)
    if op in ("profile_delete", "cluster_delete"):  # a model it was active on keeps its live values
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
    if op == "profile_activate":  # the profile's (a cluster's: dialled) strengths as the live state
        bases.checked_strengths(state, profile)  # refused, not half-applied, if invalid for the SAEs now
        return _activated(store, limits, attrs.evolve(state, strengths=bases.checked(state, profile["strengths"],
                                                                                    "strengths")),
                          "profile", name)
    if op == "cluster_intensity":  # the persistent dial: [0, the cap]; an active cluster re-applies at once
        cluster = profile["cluster"]
        _dial(args["intensity"], rules.cluster_bounds(cluster["intensity_range"], limits)[1], "intensity")
        profile["cluster"] = {**cluster, "intensity": args["intensity"]}
        profile["updated_at"] = int(time.time())
        store.put_profile(profile)
        live = state.active == {"kind": "profile", "name": name}
        return {"cluster": bases.cluster_summary(profile, store), "state": _put(store, limits, state) if live else None}
    raise GreenroomError("invalid_parameter", f"unknown steering command {op!r}")


def _circuit_command(store: SteeringStore, limits: rules.Limits, op: str, model: str, args: dict) -> dict:
    if op == "circuit_list":
        return {"circuits": [bases.circuit_summary(c, store) for c in store.circuits()]}
    if op == "circuit_import":
        return bases.circuit_summary(bases.new_circuit(store, store.get(model), args), store)
    if op == "circuit_active":
        state = store.get(model)
        circuit = store.circuit(state.active["name"]) if (state.active or {}).get("kind") == "circuit" else None
        serving = bases.serving(store, state, limits) if circuit is not None else None
        return {"model": model, "circuit": bases.circuit_summary(circuit, store) if circuit else None,
                "serving_mode": serving and serving["mode"], "reason": serving and serving["reason"],
                "steering": _circuit_steering(store, state, serving, limits) if serving else None}
    name = args["name"]
    circuit = store.circuit(name)
    if circuit is None:
        raise GreenroomError("circuit_not_found", f"no circuit named {name!r}", "name")
    if op == "circuit_get":
        return bases.circuit_summary(circuit, store)
    if op == "circuit_delete":  # a model it was active on keeps its live values, with no rung
        store.delete_circuit(name)
        return {"name": name, "deleted": True}
    state = store.get(circuit["model"])
    if op == "circuit_activate":
        return _activated(store, limits, state, "circuit", name)
    if op == "circuit_intensity":  # stored as dialled; serving clamps it into the circuit's range
        _dial(args["intensity"], rules.ENVELOPE[1], "intensity")
        circuit = {**circuit, "intensity": args["intensity"], "updated_at": int(time.time())}
        store.put_circuit(circuit)
        live = state.active == {"kind": "circuit", "name": name}
        return {"circuit": bases.circuit_summary(circuit, store), "state": _put(store, limits, state) if live else None}
    raise GreenroomError("invalid_parameter", f"unknown steering command {op!r}")


def _circuit_steering(store: SteeringStore, state: ModelSteering, serving: dict, limits: rules.Limits) -> dict | None:
    """GET /api/circuits/active's `steering`: present only while the circuit genuinely steers
    (what X-miLLM-Circuit-Rung says), with the values each layer applies."""
    if "rung" not in serving:
        return None
    by_id = {sae["sae_id"]: sae for sae in state.saes}
    return {"rung": serving["rung"], "language": serving["language"], "header": rules.rung_header(serving["rung"]),
            "intensity": serving["intensity"],
            "layers": [{"layer": by_id[sae_id]["layer"], "sae_id": sae_id, "strengths": strengths}
                       for sae_id, strengths in state.strengths.items()]}


def _dial(value: float, cap: float, param: str) -> None:
    if not 0 <= value <= cap:
        raise GreenroomError("invalid_parameter", f"the intensity {value:g} is outside [0, {cap:g}]", param)


def _put_profile(store: SteeringStore, state: ModelSteering, profile: dict, strengths: dict,
                 param: str | None = None) -> dict:
    """Store `profile` with `strengths` checked against the SAEs attached now, and their identities."""
    strengths = bases.checked(state, strengths, param)
    saes = [{k: sae[k] for k in bases.SAE_IDENTITY} for sae in state.saes if sae["sae_id"] in strengths]
    profile = {**profile, "strengths": strengths, "saes": saes, "updated_at": int(time.time())}
    store.put_profile(profile)
    return profile


def _resolve_sae(cache_dir: str | None, source: str, layer: int | None, sae_id: str | None,
                 placement: dict) -> dict:
    """The record of SAE `source` ("demo:<size>[:<layer>]", "random:<d_in>:<layer>" or a
    directory) for the model placed at `placement`, after loading it and checking that the
    model can take it."""
    from greenroom.engines.demo_model import default_cache_dir
    from greenroom.engines.demo_sae import ensure_demo_sae
    from greenroom.engines.loader import source_path
    from greenroom.engines.random_sae import PREFIX as RANDOM_SAE, ensure_random_sae
    from greenroom.engines.sae import SAEFormatError, load_sae  # torch: only once an SAE is attached

    try:
        if source.startswith("demo:"):
            size, _, named = source[len("demo:"):].partition(":")
            if named and layer is not None and int(named) != layer:
                raise ValueError(f"{source!r} names layer {named}, the request layer {layer}")
            layer = int(named) if named else layer
            path = ensure_demo_sae(default_cache_dir(cache_dir), size, layer)
            default_id = f"sae_demo_{size}_l{path.name.removeprefix('layer-')}"
        elif source.startswith(RANDOM_SAE):  # random directions of a model's shape (engines/random_sae.py)
            path, default_id = ensure_random_sae(default_cache_dir(cache_dir), source)
        else:
            path = Path(source).expanduser().resolve()
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{path.parent.name}_{path.name}").strip("_")
            # a folder named "sae" (…/sae/layer-5) names no SAE twice: sae_layer-5, not sae_sae_layer-5
            default_id = "sae_" + (re.sub(r"^(sae[_.-]+)+", "", stem, flags=re.IGNORECASE) or stem)
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
