"""What the Ollama read routes (/api/tags, /api/ps, /api/show) say about a model, read
from its files without loading it: a GGUF file's header (engines/llama_cpp/gguf_meta.py), a
checkpoint's config.json and safetensors headers, an OpenVINO directory's config.json and
IR. A model built at its first load is described by what it is built from until then: a model
converted from a GGUF file (`gguf-converted:`) by that file, a GGUF written from a checkpoint
(`gguf-from:`) by that checkpoint, a demo GGUF or OpenVINO model by
the demo checkpoint it is made from, a demo checkpoint not built yet by its definition
(engines/demo/demo_model.py); a zipped checkpoint (`unpacked:`) is unpacked to be described
(a second's work its first load would do). An embedding model's capability is `embedding`
alone, as Ollama shows one; its window is the length its checkpoint was trained for. The routes take a `Placed` snapshot in the trio thread and read the
files in a worker.

Rendering is total: whatever a file or a stored deadline holds, these routes answer — a
value that cannot be shown is left out, emptied or clamped (a timestamp past year 9999 is
9999-12-31), never raised."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from greenroom.engines.base import EngineError, ModelInfo
from greenroom.engines.capabilities import Capabilities
from greenroom.engines.demo import demo_model
from greenroom.engines.llama_cpp import gguf_files, gguf_meta
from greenroom.engines.loader import CONVERTED, GGUF_FROM, UNPACKED, checkpoint_json, resolve_source, source_path
from greenroom.engines.text.pooling import max_seq_length
from greenroom.http.core.contracts import Choice, ListOf, Text
from greenroom.http.core.objects import AN_OBJECT, COUNT, TEXT, Object, or_null
from greenroom.http.ollama import ollama_params
from greenroom.supervisor.placements import Placement

if TYPE_CHECKING:
    from greenroom.supervisor.tree import Tree

_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_LAST = datetime.datetime.max.replace(tzinfo=_UTC)
_GO_ZERO = "0001-01-01T00:00:00Z"  # Go's zero time: what Ollama shows for a time it does not know
# a loaded model with no keep_alive deadline never expires: shown as Ollama shows keep_alive -1
# (the largest duration Go has, ~292 years)
_FOREVER_S = float((2**63 - 1) // 10**9)
# the dtype a checkpoint's weights are stored in → Ollama's quantization_level
_DTYPE_LEVEL = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# IR constants that are not weights (shapes, indices, masks): left out of its storage type, as
# the OpenVINO engine leaves them out
_IR_NOT_WEIGHTS = {"i64", "i32", "boolean"}
# safetensors element types that are not weights
_SAFETENSORS_NOT_WEIGHTS = {"I64", "I32", "BOOL"}
# Ollama's GGUF keys that /api/show leaves out of model_info (the template has its own field)
_NOT_INFO = {"general.name", "tokenizer.chat_template"}


def rfc3339(ts) -> str:
    """RFC 3339 in UTC for any number of seconds since the epoch: clamped to years 1–9999;
    a time that is not one (None, NaN) is Go's zero time, as Ollama shows it."""
    if ts is None or (isinstance(ts, float) and math.isnan(ts)):
        return _GO_ZERO
    try:
        at = _EPOCH + datetime.timedelta(seconds=ts)
    except OverflowError:  # past either end of the calendar (infinities included)
        at = _LAST if ts > 0 else datetime.datetime.min.replace(tzinfo=_UTC)
    return at.isoformat().replace("+00:00", "Z")


@attrs.frozen
class Placed:
    """A placed model as the read routes see it, taken in the trio thread."""

    name: str
    placement: Placement
    info: ModelInfo | None  # while loaded
    expires_in: float | None = None  # seconds to its keep_alive deadline; None: never

    @classmethod
    def of(cls, tree: Tree, model: str, now: float) -> Placed:
        """`now`: trio's clock, which the tree's deadlines are on."""
        m = tree.state_of(model)
        return cls(model, m.placement, m.info, None if m.expires_at is None else m.expires_at - now)


@attrs.frozen
class Facts:
    path: Path  # the model's file or directory (where a demo model will be, before it is built)
    size: int  # the bytes of its files
    modified: float | None  # its newest file's mtime
    digest: str  # identifies the files (their names, sizes, mtimes), not a hash of their bytes
    details: dict  # Ollama's `details`
    info: dict  # Ollama's `model_info`; a long GGUF array as gguf_meta.Skipped
    template: str
    context: int | None  # the context window the model was trained for
    gguf: gguf_meta.GGUFMeta | None = None


def facts(p: Placed) -> Facts:
    """Everything the read routes show of `p`, from its files (a worker thread's call)."""
    path = _described_by(p.placement)
    if isinstance(path, str):
        return _defined(p, path)
    # an uploaded GGUF file (store/blobs.py) has no suffix; an unbuilt demo GGUF is described by its checkpoint
    if path.suffix == ".gguf" or (p.placement.engine == "llama.cpp" and path.is_file()):
        return _gguf(p, path)
    files = _files(path)
    config = checkpoint_json(path)
    family = _text(config.get("model_type"))
    context = _count(config.get("max_position_embeddings"))
    if context is not None:  # a sentence-transformers checkpoint's trained length, within its positions
        context = min(max_seq_length(path) or context, context)
    template = p.placement.chat_template or _chat_template(path)
    info = _config_info(config, family, context)
    if (path / "openvino_model.xml").is_file():
        # no parameter count: an IR's constants hold more than the parameters (rope tables,
        # a compressed weight's scales), so any count read from them would be a guess
        details = _details("openvino", family, None, _ir_storage(path / "openvino_model.xml"))
        return Facts(path, *_stamp(p, path, files), details, info, template, context)
    parameters = _safetensors_parameters(path)
    if parameters is None and p.info is not None:  # no safetensors: the loaded model's count
        parameters = _count(p.info.parameters)
    if parameters is not None:
        info["general.parameter_count"] = parameters
    fmt = "safetensors" if any(name.endswith(".safetensors") for name, _ in files) else ""
    return Facts(
        path,
        *_stamp(p, path, files),
        _details(fmt, family, parameters, _checkpoint_level(config)),
        info,
        template,
        context,
    )


def _described_by(placement: Placement) -> Path | str:
    """The files that describe a model now (imports no torch; builds nothing but a zipped
    checkpoint's folder): its own, or while it is not built yet those it is built from; a demo
    size (str) when nothing is built."""
    path, source = placement.path(), placement.source
    if source.startswith(UNPACKED) and not (path / "config.json").is_file():
        try:
            return resolve_source(source, placement.cache_dir)
        except EngineError:  # no such zip: described as it is (nothing)
            return path
    if source.startswith(CONVERTED) and not (path / "config.json").is_file():
        return source_path(source[len(CONVERTED) :], placement.cache_dir)  # not converted yet: its GGUF
    if source.startswith(GGUF_FROM) and not path.is_file():
        return source_path(source[len(GGUF_FROM) :], placement.cache_dir)  # not written yet: its checkpoint
    if source.startswith(("demo-gguf:", "demo-openvino:")) and not path.exists():
        size = source.partition(":")[2] if source.startswith("demo-openvino:") else "tiny"
        source = f"demo:{size}"  # the demo GGUF and OpenVINO models are made from the demo checkpoint
        path = source_path(source, placement.cache_dir)
    if source.startswith("demo:") and not (path / "config.json").is_file():
        return source.partition(":")[2]
    return path


def _defined(p: Placed, size: str) -> Facts:
    """A demo model whose checkpoint is not built yet: what its generator will write — the
    family, parameters, window and dtype of its definition, its weights' bytes, and for its
    time the generator's own (the definition its weights come from)."""
    spec = demo_model.SIZES[size]
    config = {"model_type": "llama", **spec}
    parameters = demo_model.parameter_count(size)
    info = {**_config_info(config, "llama", spec["max_position_embeddings"]), "general.parameter_count": parameters}
    generator = _stat(Path(demo_model.__file__))
    digest = hashlib.sha256(json.dumps([p.placement.source, demo_model.GENERATOR_VERSION, spec]).encode())
    return Facts(
        p.placement.path(),
        parameters * _DTYPE_BYTES[spec["dtype"]],
        generator.st_mtime if generator is not None else None,
        digest.hexdigest(),
        _details("safetensors", "llama", parameters, _checkpoint_level(config)),
        info,
        p.placement.chat_template or "",
        spec["max_position_embeddings"],
    )


# --- the objects (openapi.py renders them) -------------------------------------------------

DETAILS = Object(
    name="OllamaDetails",
    fields={
        "parent_model": TEXT,
        "format": TEXT,
        "family": TEXT,
        "families": or_null(ListOf(items=TEXT)),
        "parameter_size": TEXT,
        "quantization_level": TEXT,
    },
)
_LISTED = {
    "name": TEXT,
    "model": TEXT,
    "modified_at": TEXT,
    "size": COUNT,
    "digest": TEXT,
    "details": DETAILS.ref(),
}
LISTED = Object(name="OllamaListed", fields=_LISTED)
RUNNING = Object(
    name="OllamaRunning",
    fields={**_LISTED, "expires_at": TEXT, "size_vram": COUNT, "context_length": or_null(COUNT)},
)
TAGS = Object(name="OllamaTags", fields={"models": ListOf(items=LISTED)})
PS = Object(name="OllamaPs", fields={"models": ListOf(items=RUNNING)})
_MESSAGE = Object(name="OllamaShownMessage", fields={"role": TEXT, "content": TEXT})
SHOWN = Object(
    name="OllamaShown",
    fields={
        "modelfile": TEXT,
        "parameters": TEXT,
        "template": TEXT,
        # a created model's own (/api/create), absent when it has none, as Ollama leaves them out
        "system": TEXT,
        "license": Text(description="Its licenses, one after another, a line break between"),
        "messages": ListOf(items=_MESSAGE, description="The conversation it begins every chat with"),
        "details": DETAILS.ref(),
        "model_info": or_null(
            AN_OBJECT,
            "null when the files say nothing of the model (the ollama CLI dies on an object "
            "without general.architecture; the Python SDK needs the key)",
        ),
        "capabilities": ListOf(items=Choice(values=("completion", "tools", "embedding"))),
        "modified_at": TEXT,
    },
    optional=("system", "license", "messages"),
)
OBJECTS = (TAGS, PS, SHOWN)


def _listed(f: Facts, name: str) -> dict:
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(f.modified),
        "size": f.size,
        "digest": f.digest,
        "details": f.details,
    }


def tags(placed: list[Placed]) -> list[dict]:
    return [LISTED.build(**_listed(facts(p), p.name)) for p in placed]


def ps(placed: list[Placed]) -> list[dict]:
    rows = []
    for p in placed:
        f = facts(p)
        left = _FOREVER_S if p.expires_in is None else max(0.0, p.expires_in)
        context = _count(p.info and p.info.context_length) or f.context
        # Ollama's size here is what the model takes loaded: its actor's report, else its files
        size = _count(p.info and p.info.footprint_bytes) or f.size
        rows.append(
            RUNNING.build(
                **{**_listed(f, p.name), "size": size},
                expires_at=rfc3339(time.time() + left),
                size_vram=size if p.placement.device.startswith("cuda") else 0,
                context_length=context,
            )
        )
    return rows


def template_of(p: Placed, f: Facts | None = None) -> str:
    """The template /api/show gives for `p`: a created model's own, else its files' chat
    template (`f`: its facts, when read already)."""
    return (p.placement.defaults or {}).get("template") or (f or facts(p)).template


def show(p: Placed, caps: Capabilities, verbose: bool) -> dict:
    """/api/show's answer; `caps`: what the model honours (tools; an embedding model: embedding
    alone, which is how chat front ends such as Open WebUI tell one). A created
    model's own system prompt, template, parameters, license and messages are shown, and the
    model it was made from as details.parent_model (Ollama leaves empty fields out)."""
    f = facts(p)
    made = p.placement.defaults or {}
    window = _count(p.info and p.info.context_length) or f.context or 0
    parameters = ollama_params.shown(window, made.get("parameters") or {})
    template, system, licenses = template_of(p, f), made.get("system") or "", made.get("license") or []
    messages = [_MESSAGE.build(role=m["role"], content=m.get("content") or "") for m in made.get("messages") or ()]
    # a llama.cpp model is its file, which `ollama create` uploads; any other is made from by name
    # (the CLI would upload a checkpoint's safetensors, which greenroom cannot create from)
    source = f.path if p.placement.engine == "llama.cpp" else p.name
    lines = [
        "# Modelfile generated by greenroom's /api/show",
        "# To build a new Modelfile based on this, replace FROM with:",
        f"# FROM {p.name}",
        "",
        f"FROM {source}",
    ]
    if template:
        lines.append(f'TEMPLATE """{template}"""')
    if system:
        lines.append(f"SYSTEM {_quoted(system)}")
    lines += [f"PARAMETER {name} {_quoted(_go_text(value))}" for name, value in parameters]
    lines += [f"LICENSE {_quoted(text)}" for text in licenses]
    lines += [f"MESSAGE {m['role']} {_quoted(m['content'])}" for m in messages]
    # every engine that honours tools serves them on every template: one that does not render them
    # gets them described in its system message (engines/text/chat.py), so Ollama clients may send them
    shown = ["completion"] + (["tools"] if caps.tools else []) if caps.generation else ["embedding"]
    own = {"system": system, "license": "\n".join(licenses), "messages": messages}
    info = _model_info(f, verbose)
    return SHOWN.build(
        modelfile="\n".join(lines) + "\n",
        parameters="\n".join(f"{name:<30} {_go_value(value)}" for name, value in parameters),
        template=template,
        **{k: v for k, v in own.items() if v},
        details=DETAILS.build(**{**f.details, "parent_model": made.get("parent_model") or ""}),
        # null when empty, where Ollama leaves it out: the `ollama` CLI reads an object it is sent
        # as having general.architecture, and dies on one without it; the Python SDK needs the key
        model_info=info or None,
        capabilities=shown,
        modified_at=rfc3339(f.modified),
    )


def _quoted(text: str) -> str:
    """A Modelfile value as Ollama's parser/parser.go quotes one: in quotes when it has a line
    break or begins or ends with a space (in triple quotes when it holds a quote too)."""
    if "\n" in text or text.startswith(" ") or text.endswith(" "):
        return f'"""{text}"""' if '"' in text else f'"{text}"'
    return text


def _go_text(value) -> str:
    """A parameter's value as Go's %v writes it (a Modelfile's PARAMETER line)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _go_value(value) -> str:
    """A parameter's value as Go's %#v writes it (/api/show's `parameters`): strings quoted."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else _go_text(value)


# --- GGUF --------------------------------------------------------------------------------------


def _gguf(p: Placed, path: Path) -> Facts:
    parts = gguf_files.split_parts(path)
    files = [(part.name, st) for part in parts if (st := _stat(part)) is not None]
    metas = []
    for part in parts:
        try:
            metas.append(gguf_meta.read(part))
        except (OSError, gguf_meta.GGUFError):
            break
    meta = metas[0] if metas else None
    if meta is None:  # not built yet, or not a readable GGUF: what the file system says
        return Facts(
            path, *_stamp(p, path, files), _details("gguf", "", None, ""), {}, p.placement.chat_template or "", None
        )
    family = _text(meta.get("general.architecture"))
    # every part counted, or no count: a part's alone is no model's
    parameters = sum(m.parameters for m in metas) if len(metas) == len(parts) else None
    label = meta.get("general.size_label")
    size = label if isinstance(label, str) and label else (_human_number(parameters) if parameters else "")
    details = {**_details("gguf", family, None, gguf_meta.file_type_label(meta)), "parameter_size": size}
    info = {k: v for k, v in meta.fields.items() if k not in _NOT_INFO}
    if parameters is not None:
        info["general.parameter_count"] = parameters
    template = p.placement.chat_template or _text(meta.get("tokenizer.chat_template"))
    return Facts(
        path, *_stamp(p, path, files), details, info, template, _count(meta.get(f"{family}.context_length")), meta
    )


def _model_info(f: Facts, verbose: bool) -> dict:
    """model_info as Ollama shows it (keys sorted): a long array is null unless `verbose`; a
    value JSON cannot carry (a NaN read from a file) is null."""
    out = {}
    for key, value in sorted(f.info.items()):
        if isinstance(value, gguf_meta.Skipped):
            value = _read_array(f, value) if verbose else None
        out[key] = _json_value(value)
    return out


def _read_array(f: Facts, skipped: gguf_meta.Skipped) -> list | None:
    try:
        return gguf_meta.read_array(f.path, f.gguf, skipped)
    except (OSError, gguf_meta.GGUFError):  # the file changed or went since its header was read
        return None


# --- checkpoints and OpenVINO directories ------------------------------------------------------


def _config_info(c: dict, arch: str, context: int | None) -> dict:
    """A config.json's sizes under the GGUF keys Ollama shows for the same model."""
    if not arch:
        return {}
    rope = c.get("rope_theta")
    if rope is None and isinstance(c.get("rope_parameters"), dict):
        rope = c["rope_parameters"].get("rope_theta")
    info = {
        "general.architecture": arch,
        f"{arch}.context_length": context,
        f"{arch}.embedding_length": c.get("hidden_size"),
        f"{arch}.block_count": c.get("num_hidden_layers"),
        f"{arch}.feed_forward_length": c.get("intermediate_size"),
        f"{arch}.attention.head_count": c.get("num_attention_heads"),
        f"{arch}.attention.head_count_kv": c.get("num_key_value_heads"),
        f"{arch}.attention.layer_norm_rms_epsilon": c.get("rms_norm_eps"),
        f"{arch}.rope.freq_base": rope,
        f"{arch}.vocab_size": c.get("vocab_size"),
        "tokenizer.ggml.bos_token_id": c.get("bos_token_id"),
        "tokenizer.ggml.eos_token_id": c.get("eos_token_id"),
    }
    return {k: v for k, v in info.items() if v is not None}


def _checkpoint_level(config: dict) -> str:
    """As the transformers engine reports it: the quantization method, else the stored dtype."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and _text(quant.get("quant_method")):
        return _text(quant.get("quant_method")).upper()
    dtype = _text(config.get("dtype")) or _text(config.get("torch_dtype"))
    return _DTYPE_LEVEL.get(dtype, dtype.upper())


def _safetensors_parameters(path: Path) -> int | None:
    """Parameters counted from the safetensors headers (shapes only; no tensor is read);
    None when there are none or one header is not what safetensors writes."""
    total, found = 0, False
    for f in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        try:
            with open(f, "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict):
            return None
        for name, t in header.items():
            # integer tensors are buffers (a BERT's position_ids), not parameters
            if name == "__metadata__" or isinstance(t, dict) and t.get("dtype") in _SAFETENSORS_NOT_WEIGHTS:
                continue
            shape = t.get("shape") if isinstance(t, dict) else None
            if not isinstance(shape, list) or not all(
                _count(d) is not None or d == 0 and type(d) is int for d in shape
            ):
                return None
            total += math.prod(shape)
            found = True
    return total if found else None


_ir_cache: dict[str, tuple[tuple[int, int], str]] = {}


def _ir_storage(xml: Path) -> str:
    """The element type most of an IR's weight elements are stored in (F32, F16, U8, U4, …),
    as the OpenVINO engine reports it; cached by (path, size, mtime)."""
    st = _stat(xml)
    if st is None:
        return ""
    key, stamp = os.fspath(xml), (st.st_size, st.st_mtime_ns)
    hit = _ir_cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    counts: dict[str, int] = {}
    try:
        for _, layer in ET.iterparse(xml):
            if layer.tag != "layer":
                continue
            data = layer.find("data")
            if layer.get("type") == "Const" and data is not None:
                kind = data.get("element_type", "")
                dims = [d.strip() for d in data.get("shape", "").split(",") if d.strip()]
                size = math.prod(int(d) for d in dims) if all(d.isdigit() for d in dims) else 0
                if kind not in _IR_NOT_WEIGHTS and size > 1:  # scalars are the graph's arithmetic
                    counts[kind.upper()] = counts.get(kind.upper(), 0) + size
            layer.clear()
    except (OSError, ET.ParseError):
        return ""
    label = max(counts, key=counts.get) if counts else ""
    _ir_cache[key] = (stamp, label)
    return label


def _chat_template(path: Path) -> str:
    try:
        return (path / "chat_template.jinja").read_text()
    except (OSError, ValueError):  # none, or not text
        pass
    template = checkpoint_json(path, "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return _text(template)


# --- common ------------------------------------------------------------------------------------


def _details(fmt: str, family: str, parameters: int | None, level: str) -> dict:
    return DETAILS.build(
        parent_model="",
        format=fmt,
        family=family,
        families=[family] if family else [],
        parameter_size=_human_number(parameters) if parameters else "",
        quantization_level=level,
    )


def _files(path: Path) -> list[tuple[str, os.stat_result]]:
    """(name relative to `path`, stat) of every file of a model: the file itself, or those
    below its directory but hidden ones (huggingface_hub's .cache/); one that vanishes
    while listed is left out."""
    if path.is_file():
        st = _stat(path)
        return [(path.name, st)] if st is not None else []
    out = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            full = Path(root, name)
            st = _stat(full)
            if st is not None:
                out.append((full.relative_to(path).as_posix(), st))
    return out


def _stamp(p: Placed, path: Path, files: list) -> tuple[int, float | None, str]:
    """(size, newest mtime, digest) of a model's files."""
    stamps = [(n, st.st_size, st.st_mtime_ns) for n, st in files]
    digest = hashlib.sha256(json.dumps([p.placement.source, stamps]).encode())
    return (sum(st.st_size for _, st in files), max((st.st_mtime for _, st in files), default=None), digest.hexdigest())


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _human_number(n: int) -> str:
    """Ollama's parameter_size form: 8.0B, 137M, 1.05M."""
    for unit, scale, fmt in (("B", 1e9, "{:.1f}"), ("M", 1e6, "{:.2f}"), ("K", 1e3, "{:.0f}")):
        if n >= scale:
            value = n / scale
            return (f"{value:.0f}" if value == int(value) else fmt.format(value)) + unit
    return str(n)


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _count(value) -> int | None:
    """A positive integer read from a file, or None for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value
