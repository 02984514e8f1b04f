"""What an attached SAE's features mean: dashboards computed on the serving model, labels,
search and contrast (docs/steering.md, "Features: dashboards, search, contrast"). JSON under
/api/saes/{sae_id}/, with OpenAI's error envelope like the rest of the steering API.

- `POST …/dashboards` starts a job the engine actor holding the model runs in its spare time
  (actors/dashboard_runner.py, engines/dashboards.py); `GET …/dashboards[/{job_id}]` shows its
  progress, `DELETE …/dashboards/{job_id}` cancels it. Jobs, results and labels live in SQLite
  (store/dashboards.py); a job the server was running when it stopped is `interrupted` at the
  next start (not resumed).
- `GET …/features/{index}` is one feature's dashboard and label; `PUT …/features/{index}/label`
  sets the label (readouts — generations' and scoring's — carry it: sae_activations.py
  `with_labels`; monitoring records: monitoring_api.py; profiles: steering_api.py `labelled`).
- `POST …/features/search`: by text (the features that fire most on it, with their positions),
  by label, or by a token the features' logit effects promote.
- `POST …/contrast`: features ranked by the difference of their mean activations over two sets
  of prompts; with `held_out`, a strength suggested for them by steering a held-out prompt, and
  with `save_as`, a profile of them at that strength.

An SAE is named by its sae_id and the model it is attached to: `model` may be left out while
exactly one model has an SAE of that id attached.
"""

from __future__ import annotations

import array
import math
import uuid

from quart import Quart, request

from greenroom.engines.base import SamplingParams
from greenroom.engines.dashboards import GENERATED_TOKENS, HIST_BINS, SEEDS
from greenroom.errors import GreenroomError
from greenroom.http.core import routes
from greenroom.http.core.contracts import AnyOf, Choice, Field, ListOf, Number, Shape, Text
from greenroom.http.core.objects import AN_OBJECT, COUNT, FLOAT, TEXT, Object, or_null
from greenroom.http.manage.steering_api import (
    DESCRIPTION,
    PROFILE_NAME,
    attached,
    document_json,
    labelled,
    read_body,
)
from greenroom.http.openai.tokenize_api import tokenized
from greenroom.http.pipeline.answering import single
from greenroom.protocol import (
    CreateProfile,
    Failed,
    FeaturesRead,
    Generate,
    GetSteering,
    ReadFeatures,
    StartDashboards,
    Tokenize,
)
from greenroom.protocol import Text as TextEvent
from greenroom.store.dashboards import FINISHED, DashboardStore
from greenroom.supervisor.tree import Tree

TEXT_MAX = 20_000
PROMPTS_MAX = 64
# the strengths contrast tries on the held-out prompt (percent of the residual norm, steering.py)
TRIED_STRENGTHS = (5.0, 10.0, 20.0, 40.0)
MEASURE_TOKENS = 16  # the held-out prompt's greedy completion, per strength tried
ENOUGH = 0.5  # the suggestion: the smallest strength that moves the measure half way to the first set

# --- request shapes (contracts.py) --------------------------------------------------------

JOB_ID = Text(pattern="dash_[0-9a-f]{16}", description="A dashboards job's id")
INDEX = Text(pattern="[0-9]{1,10}", description="A feature's index, below the SAE's width")
_MODEL = Text(min_length=1, description="The model the SAE is attached to; left out: the one model it is attached to")
_COUNT = Number(lo=0, hi=2**31 - 1, integer=True)
_TEXT = Text(min_length=1, max_length=TEXT_MAX)
_PROMPTS = ListOf(items=_TEXT, min_items=1, max_items=PROMPTS_MAX)
DASHBOARDS = Shape(
    fields={
        "model": _MODEL,
        "features": AnyOf(
            options=(
                ListOf(items=_COUNT, min_items=1),
                Shape(fields={"start": _COUNT, "end": _COUNT}, required=("start", "end"), closed=True),
            ),
            description="The features: a list of indices, or {start, end} (half-open). Left out: every feature",
        ),
        "corpus": Shape(
            fields={
                "files": ListOf(
                    items=Text(min_length=1),
                    min_items=1,
                    max_items=64,
                    description="Text files on the server (.txt read whole; .jsonl: one JSON string, or an "
                    'object with a string "text", a line)',
                ),
                "seeds": ListOf(items=_TEXT, min_items=1, max_items=64),
                "generated_tokens": Number(lo=1, hi=1024, integer=True, default=GENERATED_TOKENS),
            },
            closed=True,
            description="Left out, or without files: the text the model writes after each seed (the "
            f"{len(SEEDS)} built-in seeds unless `seeds` is given), `generated_tokens` each, sampled unsteered",
        ),
        "top_k": Number(lo=1, hi=32, integer=True, default=8, description="Top-activating contexts kept per feature"),
        "context_tokens": Number(lo=4, hi=256, integer=True, default=32, description="Tokens per context"),
        "max_tokens": Number(
            lo=16, hi=10_000_000, integer=True, default=4096, description="Corpus tokens read at most"
        ),
        "logit_k": Number(lo=1, hi=100, integer=True, default=10, description="Promoted and suppressed tokens kept"),
    },
    closed=True,
)
LABEL = Shape(
    fields={"model": _MODEL, "label": Text(max_length=200, description='The label; "" removes it')},
    required=("label",),
    closed=True,
)
SEARCH = Shape(
    fields={
        "model": _MODEL,
        "text": Text(min_length=1, max_length=TEXT_MAX, description="The features that fire most on this text"),
        "label": Text(min_length=1, max_length=200, description="Features whose label holds this (any case)"),
        "token": Text(
            min_length=1, max_length=200, description="Features whose logit effects promote this token (one token)"
        ),
        "top_k": Number(lo=1, hi=64, integer=True, default=10),
    },
    closed=True,
    description="Exactly one of text, label, token",
    rules=(
        {
            "oneOf": [
                {"required": [name], "properties": {name: {"type": "string"}}} for name in ("text", "label", "token")
            ]
        },
    ),
)
CONTRAST = Shape(
    fields={
        "model": _MODEL,
        "positive": _PROMPTS,
        "negative": _PROMPTS,
        "top_k": Number(lo=1, hi=64, integer=True, default=5),
        "held_out": Text(
            min_length=1,
            max_length=TEXT_MAX,
            description="A prompt in neither set: the top features are steered on it to suggest a strength",
        ),
        "save_as": PROFILE_NAME,
        "description": DESCRIPTION,
    },
    required=("positive", "negative"),
    closed=True,
    rules=(
        {
            "if": {"required": ["save_as"], "properties": {"save_as": {"type": "string"}}},
            "then": {"required": ["held_out"], "properties": {"held_out": {"type": "string"}}},
        },
    ),
)

# --- response objects (objects.py) ------------------------------------------------------

JOB = Object(
    name="DashboardJob",
    fields={
        "id": TEXT,
        "model": TEXT,
        "sae_id": TEXT,
        "status": Choice(values=("queued", "running", *FINISHED)),
        "features": ListOf(items=COUNT),
        "corpus": AN_OBJECT,
        "top_k": COUNT,
        "context_tokens": COUNT,
        "max_tokens": COUNT,
        "logit_k": COUNT,
        "progress": AN_OBJECT,
        "error": or_null(TEXT),
        "created_at": FLOAT,
        "updated_at": FLOAT,
    },
)
JOBS = Object(name="DashboardJobs", fields={"jobs": ListOf(items=JOB.ref())})
_ABOUT = {"model": TEXT, "sae_id": TEXT}  # whose features an answer is about
_TOKEN_VALUE = Object(name="TokenValue", fields={"id": COUNT, "text": TEXT, "value": FLOAT})
FEATURE = Object(
    name="FeatureDashboard",
    fields={
        **_ABOUT,
        "index": COUNT,
        "label": or_null(TEXT),
        "logit_effects": or_null(
            Object(
                name="LogitEffects",
                fields={"promoted": ListOf(items=_TOKEN_VALUE.ref()), "suppressed": ListOf(items=_TOKEN_VALUE.ref())},
            ),
            "W_dec[index] · W_Uᵀ: the tokens the decoder direction raises and lowers most; null: no job computed them",
        ),
        "tokens": or_null(COUNT, "Corpus positions counted (each context's first left out)"),
        "density": or_null(FLOAT, "The fraction of those positions where the feature is active"),
        "histogram": or_null(
            Object(
                name="ActivationHistogram",
                fields={
                    "edges": ListOf(items=FLOAT, description=f"{HIST_BINS + 1} edges, log-spaced"),
                    "counts": ListOf(
                        items=COUNT, description="Below the first edge, each bin between two edges, above the last"
                    ),
                },
            )
        ),
        "contexts": or_null(
            ListOf(
                items=Object(
                    name="FeatureContext",
                    fields={
                        "max": FLOAT,
                        "max_position": COUNT,
                        "tokens": ListOf(
                            items=Object(name="ContextToken", fields={"id": COUNT, "text": TEXT, "activation": FLOAT})
                        ),
                    },
                )
            ),
            "The top-activating contexts, largest first",
        ),
        "jobs": Object(
            name="FeatureJobs",
            fields={"logit_effects": or_null(TEXT), "corpus": or_null(TEXT)},
            description="The jobs that computed each part",
        ),
    },
)
_POSITION = Object(name="FeaturePosition", fields={"position": COUNT, "token": TEXT, "value": FLOAT})
SEARCHED = Object(
    name="FeatureSearch",
    fields={
        **_ABOUT,
        "tokens": ListOf(items=TEXT, description="By text: the text's tokens"),
        "features": ListOf(
            items=Object(
                name="FeatureHit",
                fields={
                    "index": COUNT,
                    "label": or_null(TEXT),
                    "value": or_null(FLOAT, "By text: the largest activation; by token: the logit effect"),
                    "mean": FLOAT,
                    "positions": ListOf(
                        items=_POSITION.ref(), description="By text: where it is active, largest first"
                    ),
                },
                optional=("value", "mean", "positions"),
            )
        ),
    },
    optional=("tokens",),
)
CONTRASTED = Object(
    name="Contrast",
    fields={
        **_ABOUT,
        "features": ListOf(
            items=Object(
                name="ContrastFeature",
                fields={
                    "index": COUNT,
                    "label": or_null(TEXT),
                    "difference": FLOAT,
                    "mean_positive": FLOAT,
                    "mean_negative": FLOAT,
                },
            ),
            description="By mean activation over the positive prompts less over the negative, largest first",
        ),
        "measure": or_null(
            Object(
                name="ContrastMeasure",
                fields={
                    "held_out": TEXT,
                    "baseline": FLOAT,
                    "target": FLOAT,
                    "tried": ListOf(
                        items=Object(
                            name="ContrastTrial",
                            fields={"strength": FLOAT, "score": FLOAT, "progress": FLOAT, "text": TEXT},
                        )
                    ),
                    "suggested": FLOAT,
                },
            ),
            "With held_out: the score (the sum of the top features' mean activations over the completion) of "
            "the unsteered completion (baseline), of the positive prompts (target), and of the completion "
            "steered at each strength tried; progress = (score − baseline) / (target − baseline)",
        ),
        "profile": or_null(AN_OBJECT, "With save_as: the profile saved"),
    },
)
OBJECTS = (JOB, JOBS, FEATURE, SEARCHED, CONTRASTED)


def register(app: Quart, tree: Tree) -> None:
    store = tree.dashboards
    store.interrupt_unfinished()  # what a previous server was running: its runner is gone

    @routes.view(app, "POST", "/api/saes/{sae_id}/dashboards")
    async def start(sae_id: str):
        body = await read_body(DASHBOARDS)
        _check(DASHBOARDS, body, "")
        model, sae = await attached(tree, sae_id, body.get("model"))
        features = _features(body.get("features"), sae["width"])
        corpus = body.get("corpus") or {}
        spec = {
            "features": features,
            "corpus": {
                "files": corpus.get("files", []),
                "seeds": corpus.get("seeds", list(SEEDS)),
                "generated_tokens": corpus.get("generated_tokens", GENERATED_TOKENS),
            },
            **{name: _given(body, DASHBOARDS, name) for name in ("top_k", "context_tokens", "max_tokens", "logit_k")},
        }
        job_id = f"dash_{uuid.uuid4().hex[:16]}"
        store.add_job(job_id, model, sae_id, spec)
        client = await _engine(tree, model)
        try:
            await single(
                client,
                StartDashboards(
                    job_id,
                    model,
                    sae_id,
                    features,
                    spec["corpus"]["files"],
                    spec["corpus"]["seeds"],
                    spec["corpus"]["generated_tokens"],
                    spec["top_k"],
                    spec["context_tokens"],
                    spec["max_tokens"],
                    spec["logit_k"],
                    tree.config.cache_dir,
                ),
            )
        except GreenroomError as exc:
            store.set_status(job_id, "failed", error=exc.message)
            raise
        return JOB.build(**store.job(job_id))

    @routes.view(app, "GET", "/api/saes/{sae_id}/dashboards")
    async def jobs(sae_id: str):
        model, _ = await attached(tree, sae_id, request.args.get("model"))
        return JOBS.build(jobs=[JOB.build(**job) for job in store.jobs(model, sae_id)])

    @routes.view(app, "GET", "/api/saes/{sae_id}/dashboards/{job_id}")
    async def job(sae_id: str, job_id: str):
        return JOB.build(**_job(store, sae_id, job_id))

    @routes.view(app, "DELETE", "/api/saes/{sae_id}/dashboards/{job_id}")
    async def cancel(sae_id: str, job_id: str):
        """Cancel the job (its engine reads this within its next progress write); a finished job
        stays as it is."""
        _job(store, sae_id, job_id)
        store.set_status(job_id, "cancelled")
        return JOB.build(**store.job(job_id))

    @routes.view(app, "GET", "/api/saes/{sae_id}/features/{index}")
    async def feature(sae_id: str, index: str):
        model, sae = await attached(tree, sae_id, request.args.get("model"))
        return _feature(store, model, sae_id, _index(index, sae))

    @routes.view(app, "PUT", "/api/saes/{sae_id}/features/{index}/label")
    async def label(sae_id: str, index: str):
        body = await read_body(LABEL)
        _check(LABEL, body, "")
        model, sae = await attached(tree, sae_id, body.get("model"))
        at = _index(index, sae)
        store.set_label(model, sae_id, at, body.get("label") or None)
        return _feature(store, model, sae_id, at)

    @routes.view(app, "POST", "/api/saes/{sae_id}/features/search")
    async def search(sae_id: str):
        body = await read_body(SEARCH)
        _check(SEARCH, body, "")
        asked = [name for name in ("text", "label", "token") if body.get(name) is not None]
        if len(asked) != 1:
            raise GreenroomError(
                "missing_parameter" if not asked else "invalid_parameter",
                "give exactly one of 'text', 'label', 'token'",
                asked[1] if len(asked) > 1 else "text",
            )
        model, _ = await attached(tree, sae_id, body.get("model"))
        top_k = _given(body, SEARCH, "top_k")
        labels = store.labels(model, sae_id)
        out = {"model": model, "sae_id": sae_id}
        if asked == ["label"]:
            hits = [{"index": i, "label": text} for i, text in store.labelled(model, sae_id, body["label"])][:top_k]
            return SEARCHED.build(**out, features=[hit(h) for h in hits])
        if asked == ["token"]:
            tokenize = Tokenize(f"tok-{uuid.uuid4().hex}", model, prompt=body["token"], add_special_tokens=False)
            ids = (await tokenized(tree, tokenize)).tokens
            promoting = [] if len(ids) != 1 else store.promoting(model, sae_id, ids[0])
            promoting.sort(key=lambda hit: -hit[1])
            return SEARCHED.build(
                **out,
                features=[hit({"index": i, "label": labels.get(i), "value": v}) for i, v in promoting[:top_k]],
            )
        row = (await _read(tree, model, sae_id, [body["text"]], 64)).rows[0]
        peaks: dict[int, list] = {}
        for position, top in enumerate(row.top):
            if position == 0 and len(row.top) > 1:
                continue  # the attention sink (engines/dashboards.py)
            for index, value in top:
                peaks.setdefault(index, []).append(
                    {"position": position, "token": row.token_texts[position], "value": value}
                )
        mean = _floats(row.mean)
        ranked = sorted(peaks, key=lambda i: -max(p["value"] for p in peaks[i]))[:top_k]
        return SEARCHED.build(
            **out,
            tokens=row.token_texts,
            features=[
                hit(
                    {
                        "index": i,
                        "label": labels.get(i),
                        "value": max(p["value"] for p in peaks[i]),
                        "mean": mean[i],
                        "positions": sorted(peaks[i], key=lambda p: -p["value"]),
                    }
                )
                for i in ranked
            ],
        )

    @routes.view(app, "POST", "/api/saes/{sae_id}/contrast")
    async def contrast(sae_id: str):
        body = await read_body(CONTRAST)
        _check(CONTRAST, body, "")
        if body.get("save_as") is not None and body.get("held_out") is None:
            raise GreenroomError(
                "missing_parameter", "save_as needs held_out: the profile's strength is measured on it", "held_out"
            )
        model, _ = await attached(tree, sae_id, body.get("model"))
        positive, negative = body["positive"], body["negative"]
        read = await _read(tree, model, sae_id, positive + negative, 1)
        means = [_floats(row.mean) for row in read.rows]
        width = len(means[0])
        pos = [sum(m[i] for m in means[: len(positive)]) / len(positive) for i in range(width)]
        neg = [sum(m[i] for m in means[len(positive) :]) / len(negative) for i in range(width)]
        ranked = sorted(range(width), key=lambda i: -(pos[i] - neg[i]))[: _given(body, CONTRAST, "top_k")]
        labels = store.labels(model, sae_id)
        top = [
            {
                "index": i,
                "label": labels.get(i),
                "difference": pos[i] - neg[i],
                "mean_positive": pos[i],
                "mean_negative": neg[i],
            }
            for i in ranked
        ]
        measure = profile = None
        if body.get("held_out") is not None:
            measure = await _measure(tree, model, sae_id, body["held_out"], top)
        if body.get("save_as") is not None:
            strengths = {sae_id: {str(f["index"]): measure["suggested"] for f in top if f["difference"] > 0}}
            description = body.get("description") or (
                f"contrast of {len(positive)} prompts against {len(negative)}; strength measured on a held-out prompt"
            )
            created = await tree.steering(CreateProfile(model, body["save_as"], description, strengths))
            profile = labelled(tree, document_json(created))
        return CONTRASTED.build(model=model, sae_id=sae_id, features=top, measure=measure, profile=profile)


def _features(value, width: int) -> list[int]:
    if value is None:
        return list(range(width))
    if isinstance(value, dict):
        start, end = value["start"], value["end"]
        if not start < end <= width:
            raise GreenroomError(
                "invalid_feature_index",
                f"features {{start, end}} must have start < end ≤ {width} (the SAE's width)",
                "features",
            )
        return list(range(start, end))
    bad = [i for i in value if i >= width]
    if bad:
        raise GreenroomError(
            "invalid_feature_index", f"feature {bad[0]} is outside the SAE (width {width})", "features"
        )
    return sorted(set(value))


def _index(raw: str, sae: dict) -> int:
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= sae["width"]:
        raise GreenroomError(
            "invalid_feature_index",
            f"feature {raw!r} is not an index of SAE {sae['sae_id']!r} (0 to {sae['width'] - 1})",
            "index",
        )
    return int(raw)


def _job(store: DashboardStore, sae_id: str, job_id: str) -> dict:
    job = store.job(job_id)
    if job is None or job["sae_id"] != sae_id:
        raise GreenroomError("dashboard_job_not_found", f"no dashboards job {job_id!r} of SAE {sae_id!r}", "job_id")
    return job


def _feature(store: DashboardStore, model: str, sae_id: str, index: int) -> dict:
    return feature_answer(model, sae_id, index, store.feature(model, sae_id, index))


def feature_answer(model: str, sae_id: str, index: int, held: dict) -> dict:
    """One feature's answer from what the store holds of it (DashboardStore.feature)."""
    stats = held["stats"] or {}
    return FEATURE.build(
        model=model,
        sae_id=sae_id,
        index=index,
        label=held["label"],
        logit_effects=held["logits"],
        tokens=stats.get("tokens"),
        density=stats.get("density"),
        histogram=stats.get("histogram"),
        contexts=stats.get("contexts"),
        jobs={"logit_effects": held["logits_job"], "corpus": held["stats_job"]},
    )


def hit(hit: dict) -> dict:
    return SEARCHED.fields["features"].items.build(**hit)


async def _engine(tree: Tree, model: str):
    """The engine client of `model`, loaded, holding the model's steering state: an engine that
    has just started may not have been pushed it yet (its SAEs attached) when it answers."""
    client, _ = await tree.client_for(model)
    await tree.push_model_steering(model, await tree.steering(GetSteering(model)))
    return client


async def _read(tree: Tree, model: str, sae_id: str, texts: list[str], top_k: int) -> FeaturesRead:
    client = await _engine(tree, model)
    return await single(client, ReadFeatures(f"feat-{uuid.uuid4().hex}", model, sae_id, texts, top_k))


def _floats(raw: bytes) -> list[float]:
    return array.array("f", raw).tolist()


async def _measure(tree: Tree, model: str, sae_id: str, held_out: str, top: list[dict]) -> dict:
    """Steer the held-out prompt with the top features (each up where the first set has more of
    it, down where less) at each strength tried; score each greedy completion by the features'
    mean activations over it (signed alike), unsteered; suggest the smallest strength that
    moves the score half way from the unsteered completion's to the positive prompts'."""
    signs = {f["index"]: 1.0 if f["difference"] > 0 else -1.0 for f in top}

    async def score(strength: float) -> tuple[float, str]:
        strengths = {sae_id: {i: s * strength for i, s in signs.items()}} if strength else {}
        text = await _complete(tree, model, held_out, strengths)
        if not text.strip():
            return 0.0, text
        mean = _floats((await _read(tree, model, sae_id, [text], 1)).rows[0].mean)
        return sum(s * mean[i] for i, s in signs.items()), text

    baseline, _ = await score(0.0)
    target = sum(s * (f["mean_positive"]) for s, f in zip(signs.values(), top))
    span = target - baseline
    tried = []
    for strength in TRIED_STRENGTHS:
        value, text = await score(strength)
        progress = (value - baseline) / span if span else 0.0
        tried.append({"strength": strength, "score": value, "progress": progress, "text": text})
    enough = [t for t in tried if t["progress"] >= ENOUGH]
    suggested = enough[0] if enough else max(tried, key=lambda t: t["score"])
    return {
        "held_out": held_out,
        "baseline": baseline,
        "target": target,
        "tried": tried,
        "suggested": suggested["strength"],
    }


async def _complete(tree: Tree, model: str, prompt: str, strengths: dict) -> str:
    """The greedy completion of `prompt` (no template) steered by `strengths` alone ({}: unsteered)."""
    client, _ = await tree.client_for(model)
    gen = Generate(
        f"cmpl-{uuid.uuid4().hex}",
        model,
        SamplingParams(max_tokens=MEASURE_TOKENS, temperature=0.0),
        prompts=[prompt],
        request_strengths=strengths,
    )
    out = []
    async with client.submit(gen) as events:
        async for event in events:
            if isinstance(event, TextEvent):
                out.append(event.text)
            elif isinstance(event, Failed):
                raise GreenroomError.from_wire(event.error)
    return "".join(out)


def _given(body: dict, shape: Shape, name: str):
    value = body.get(name)
    return shape.fields[name].default if value is None else value


def _check(field: Field, value, path: str) -> None:
    """`value` against its declaration: a typed 400 naming where it goes wrong."""
    where = path or "body"
    if value is None:
        return
    if isinstance(field, Shape):
        if not isinstance(value, dict):
            raise GreenroomError("invalid_parameter", f"'{where}' must be an object", where)
        for name in field.required:
            if value.get(name) is None:
                raise GreenroomError("missing_parameter", f"you must provide {_join(path, name)}", _join(path, name))
        for name, item in value.items():
            if name not in field.fields:
                raise GreenroomError("invalid_parameter", f"unknown field {_join(path, name)}", _join(path, name))
            _check(field.fields[name], item, _join(path, name))
    elif isinstance(field, AnyOf):
        for option in field.options:
            try:
                _check(option, value, path)
                return
            except GreenroomError:
                continue
        raise GreenroomError("invalid_parameter", f"'{where}' is not valid: {field.description}", where)
    elif isinstance(field, ListOf):
        if not isinstance(value, list) or not (field.min_items or 0) <= len(value) <= (field.max_items or math.inf):
            raise GreenroomError(
                "invalid_parameter",
                f"'{where}' must be a list of {field.min_items or 0} to {field.max_items or 'any number of'} items",
                where,
            )
        for n, item in enumerate(value):
            if item is None:
                raise GreenroomError("invalid_parameter", f"'{where}[{n}]' must not be null", f"{where}[{n}]")
            _check(field.items, item, f"{where}[{n}]")
    elif isinstance(field, Number):
        if not field.holds(value) or (isinstance(value, float) and not math.isfinite(value)):
            bounds = f" from {field.lo:g}" if field.lo is not None else ""
            bounds += f" to {field.hi:g}" if field.hi is not None else ""
            kind = "an integer" if field.integer else "a number"
            raise GreenroomError("invalid_parameter", f"'{where}' must be {kind}{bounds}", where)
    elif isinstance(field, Text) and not field.matches(value):
        limits = f" of {field.min_length or 0} to {field.max_length} characters" if field.max_length else ""
        raise GreenroomError("invalid_parameter", f"'{where}' must be a string{limits}", where)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
