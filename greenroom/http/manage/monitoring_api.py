"""SAE monitoring (issue 5): with monitoring on for a model, each generation's top-k SAE
features — read before steering, over every position of the sequence — are recorded, per
choice; operators configure it and read the records here. JSON under /api/, with OpenAI's
error envelope like the steering API.

The configuration lives in SQLite (store/monitoring.py), the records in the front end's
memory (supervisor/monitoring.py), which the generation path asks what to monitor and hands
the records (`Monitoring.monitored`, `recorded`); scoring and embeddings never do, and the
engine runs them with every SAE hook suppressed besides. A monitored request is served on the
serial path. A record's features carry the labels users set (PUT
/api/saes/{sae_id}/features/{index}/label) as they are when it is read: the records kept stay
bare.
"""

from __future__ import annotations

import attrs
import trio
from quart import Quart, request

from greenroom.errors import GreenroomError
from greenroom.http.core import contracts, framing, routes
from greenroom.http.manage.steering_api import read_body
from greenroom.http.openai import openai_params
from greenroom.http.pipeline import sae_activations
from greenroom.store.monitoring import MonitorConfig
from greenroom.supervisor.monitoring import RING_SIZE
from greenroom.supervisor.tree import Tree

TOP_K_MAX = 64
DEFAULT_LIMIT = 100
HEARTBEAT_S = 15.0  # an idle stream sends a comment this often: proxies keep it, a gone client shows

# --- request shapes (contracts.py) --------------------------------------------------------

CONFIGURE = contracts.Shape(
    fields={
        "model": openai_params.MODEL,
        "enabled": contracts.Boolean(),
        "sae_id": contracts.Text(
            description="An SAE attached to the model; left out: the one attached (when several "
            "are, name one), or when disabling, the one configured"
        ),
        "top_k": contracts.Number(
            lo=1,
            hi=TOP_K_MAX,
            integer=True,
            description="Features each record lists; left out: as configured (8 at first)",
        ),
    },
    required=("model", "enabled"),
    closed=True,
)
MODEL_QUERY = contracts.Shape(fields={"model": contracts.Text(description="Only this model")})
RECORDS_QUERY = contracts.Shape(
    fields={
        **MODEL_QUERY.fields,
        "since": contracts.Number(lo=0, integer=True, default=0, description="Only records with a larger id"),
        "limit": contracts.Number(
            lo=1, hi=RING_SIZE, integer=True, default=DEFAULT_LIMIT, description="At most this many"
        ),
    }
)


def register(app: Quart, tree: Tree) -> None:
    @routes.view(app, "GET", "/api/monitoring")
    async def configs():
        """Each steerable model's monitoring configuration."""
        return {"models": [_config(tree.monitoring.config(model)) for model in tree.steerable()]}

    @routes.view(app, "PUT", "/api/monitoring")
    async def configure():
        body = await read_body(CONFIGURE)
        model = tree.resolve(openai_params.model_name(body))
        tree.require_steering(model, "monitored")
        enabled = body.get("enabled")
        if not isinstance(enabled, bool):
            raise GreenroomError.wrong(enabled, "'enabled' must be true or false", "enabled")
        top_k = body.get("top_k")
        if top_k is not None and not CONFIGURE.fields["top_k"].holds(top_k):
            raise GreenroomError("invalid_parameter", f"'top_k' must be an integer from 1 to {TOP_K_MAX}", "top_k")
        sae_id = body.get("sae_id")
        if sae_id is not None and not isinstance(sae_id, str):
            raise GreenroomError(
                "invalid_parameter", "'sae_id' must be the id of an SAE attached to the model", "sae_id"
            )
        held = tree.monitoring.config(model)
        if sae_id is not None or enabled:  # what monitoring will read must be attached now
            sae_id = (await sae_activations.attached_sae(tree, model, sae_id, "sae_id", ambiguous="missing_parameter"))[
                "sae_id"
            ]
        config = MonitorConfig(model, enabled, sae_id or held.sae_id, top_k or held.top_k)
        return _config(await tree.monitoring.configure(config))

    @routes.view(app, "GET", "/api/monitoring/records")
    async def records():
        """The records kept (the last RING_SIZE), oldest first, newer than `since`."""
        model = _model_filter(tree)
        since, limit = _integer("since"), _integer("limit")
        out, after = tree.monitoring.records(model, since, limit)
        return {"records": _labelled(tree, out), "next": after}

    @routes.view(app, "GET", "/api/monitoring/stream")
    async def stream():
        """Each new record as a server-sent event, until the client goes."""
        model = _model_filter(tree)

        async def events():
            with tree.monitoring.subscribe(model) as subscriber:
                yield b": monitoring\n\n"  # the stream is open (and subscribed) from the first byte
                while True:
                    item = None
                    try:
                        with trio.move_on_after(HEARTBEAT_S):
                            item = await subscriber.receive()
                    except GreenroomError as exc:  # closed: the server is shutting down
                        yield framing.sse_error(exc.openai_body())
                        return
                    if item is None:
                        yield b": keep-alive\n\n"
                    elif item[0] == "dropped":  # this reader fell behind; /records still has them
                        yield framing.sse({"dropped": item[1]}, "dropped")
                    else:
                        yield framing.sse(_labelled(tree, [item[1]])[0])

        return framing.streamed(events(), framing.SSE, {})


def _config(config: MonitorConfig) -> dict:
    return attrs.asdict(config)


def _labelled(tree: Tree, records: list[dict]) -> list[dict]:
    """`records` with a `label` on each feature that has one, as a readout's features have it
    (left out where none is set, so an unlabelled record reads as before)."""
    held: dict[tuple[str, str], dict[int, str]] = {}
    out = []
    for record in records:
        key = (record["model"], record["sae_id"])
        if key not in held:
            held[key] = tree.dashboards.labels(*key)
        labels = held[key]
        features = [{**f, "label": labels[f["index"]]} if f["index"] in labels else f for f in record["features"]]
        out.append({**record, "features": features} if labels else record)
    return out


def _model_filter(tree: Tree) -> str | None:
    name = request.args.get("model")
    return None if name is None else tree.resolve(name)


def _integer(name: str) -> int:
    """A query parameter of RECORDS_QUERY, in decimal digits."""
    field = RECORDS_QUERY.fields[name]
    raw = request.args.get(name)
    if raw is None:
        return field.default
    if not (raw.isascii() and raw.isdigit()) or not field.within(int(raw)):
        raise GreenroomError(
            "invalid_parameter",
            f"'{name}' must be an integer ≥ {field.lo}" + (f" and ≤ {field.hi}" if field.hi is not None else ""),
            name,
        )
    return int(raw)
