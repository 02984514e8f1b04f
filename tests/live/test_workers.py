"""A second host's engine actors in the tree (supervisor/workers.py, hosts/): a `greenroom
worker` whose actors bind 127.0.0.2 joins a main server over the token-keyed TLS link; its
actor serves chats plain and streamed, loads a model on demand and spawns a GGUF actor; a
kill -9 of its whole tree mid-stream is a typed error event and a 503 naming the host until it
rejoins, with its steering pushed again; a model placed with actor = "auto" loads on the
worker host's actor while this host has none; replicas on both hosts are routed between;
keep_alive unloads on the worker host; a wrong, missing or absent token (a raw tractor peer)
gets nothing run; SIGTERM of the main host leaves no process on either host."""

import concurrent.futures
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import httpx
import msgspec
import openai
import psutil
import pytest
from conftest import ROOT, UNENDING, Server, free_port

TOKEN = "test-worker-token-0123456789abcdef"
HOST = "hostb"
SAE_ID = "sae_demo_tiny_l1"
TIMEOUT_S = 3.0  # a link silent this long is a lost host


def config(listen_port: int) -> str:
    return f"""
engine_actors = []
npu_actors = []
workers_listen = "127.0.0.1:{listen_port}"
worker_timeout_s = {TIMEOUT_S}

[[models]]
id = "remote-demo"
source = "demo:tiny"
actor = "{HOST}/cpu"
sae = "demo:tiny"

[[models]]
id = "remote-lazy"
source = "demo:tiny"
actor = "{HOST}/cpu"
preload = false

[[models]]
id = "remote-gguf"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
actor = "{HOST}"

[[models]]  # actor = "auto", and this host has no engine actor: a worker host's, chosen at load
id = "anywhere"
source = "demo:tiny"

[[models]]  # replicas across hosts: this host's GGUF actor preferred, the worker host's beside it
id = "pair"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"

[[models]]
id = "pair"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"
actor = "{HOST}"
"""


class Worker:
    """A `greenroom worker` process: the second "host", its actors on 127.0.0.2."""

    def __init__(self, tmp, listen_port: int, token: str | None = TOKEN, name: str = HOST):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("GREENROOM_WORKER_TOKEN", None)
        if token is not None:
            env["GREENROOM_WORKER_TOKEN"] = token
        self.log_path = tmp / f"worker-{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "greenroom", "worker", "--join", f"127.0.0.1:{listen_port}"]
        cmd += ["--name", name, "--actors", "cpu", "--bind", "127.0.0.2"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        me = psutil.Process(self.proc.pid)
        return [me, *me.children(recursive=True)]


@pytest.fixture(scope="module")
def main(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("workers")
    port = free_port()
    srv = Server(tmp, model_cache, config(port), extra_env={"GREENROOM_WORKER_TOKEN": TOKEN})
    srv.listen_port, srv.tmp, srv.workers = port, tmp, []
    yield srv
    srv.stop()
    for w in srv.workers:
        if w.proc.poll() is None:
            w.proc.kill()


def start_worker(srv: Server) -> Worker:
    srv.workers.append(Worker(srv.tmp, srv.listen_port))
    return srv.workers[-1]


def wait_ready(srv: Server, actor: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = srv.actors().get(actor)
        if row and row["state"] == "ready":
            return row
        time.sleep(0.2)
    raise TimeoutError(f"{actor} not ready:\n{srv.log()}")


def chat(srv: Server, model: str = "remote-demo", **kw) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, **kw}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)


def generate(srv: Server, model: str, **kw) -> httpx.Response:
    body = {"model": model, "prompt": "Hello", "stream": False, "options": {"num_predict": 4}, **kw}
    return httpx.post(srv.url + "/api/generate", json=body, timeout=120)


def models(srv: Server) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(srv.url + "/api/models", timeout=10).json()["models"]}


def nowhere_to_load(r: httpx.Response) -> bool:
    """The 503 of an auto placement while no host has an engine actor up for it."""
    error = r.json()["error"]
    return r.status_code == 503 and error["code"] == "model_not_loaded" and 'actor = "auto"' in error["message"]


def routed_while_a_stream_runs(srv: Server, model: str) -> httpx.Response:
    """An Ollama request for `model` while a long stream of it runs on its preferred placement."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Go"}], max_tokens=2000, stream=True, **UNENDING
    )
    with stream:
        next(c for c in stream if c.choices and c.choices[0].delta.content)
        return generate(srv, model)


def steering(srv: Server) -> dict:
    rows = httpx.get(srv.url + "/api/steering", timeout=30).json()["models"]
    return next(row for row in rows if row["model"] == "remote-demo")


def test_no_token_no_admission_and_nothing_run(main):
    before = main.actors()
    # a request before the host has joined: 503 naming it, at once
    r = chat(main)
    assert r.status_code == 503 and f"worker host {HOST!r}" in r.json()["error"]["message"], r.text
    assert before[f"{HOST}/cpu"]["state"] == "offline" and before[f"{HOST}/cpu"]["host"] == HOST
    # a wrong token, and none: refused before anything is admitted; the worker gives up
    wrong = Worker(main.tmp, main.listen_port, token="not-the-token-0123456789", name="intruder")
    missing = Worker(main.tmp, main.listen_port, token=None, name="intruder")
    assert wrong.proc.wait(30) == 2 and "GREENROOM_WORKER_TOKEN differs" in wrong.log()
    assert missing.proc.wait(30) == 2 and "GREENROOM_WORKER_TOKEN is not set" in missing.log()
    # a raw tractor peer: handshake, then ask for the actor's own `cancel` and for an engine session
    uid = ["intruder", "0"]
    frames = [uid, {"cmd": ["self", "cancel", {}, uid, "c1"]}]
    frames.append({"cmd": ["greenroom.actors.engine_actor", "engine_session", {}, uid, "c2"]})
    with socket.create_connection(("127.0.0.1", main.listen_port), timeout=15) as raw:
        try:
            for frame in frames:
                body = msgspec.msgpack.encode(frame)
                raw.sendall(struct.pack("<I", len(body)) + body)
            answer = raw.recv(65536)  # the TLS handshake fails: closed without a byte of tractor
        except (BrokenPipeError, ConnectionResetError):  # it hung up before we were done
            answer = b""
    assert answer == b"" or answer[:1] == b"\x15"  # nothing, or a TLS alert record
    after = main.actors()
    assert set(after) == set(before)  # no intruder's actor
    assert {n: (a["pid"], a["restarts"]) for n, a in after.items()} == {
        n: (a["pid"], a["restarts"]) for n, a in before.items()
    }
    assert main.log().count("refused a connection") >= 2
    # no host has an engine actor for the auto placement yet; the replica on the absent host is skipped
    assert nowhere_to_load(chat(main, "anywhere")) and "anywhere" not in models(main)
    assert [row["actor"] for row in models(main)["pair"]["replicas"]] == ["gguf:pair"]
    r = routed_while_a_stream_runs(main, "pair")
    assert r.status_code == 200 and r.headers["X-NPU-Proxy-Route-Reason"] == "preferred_device", r.text


def test_remote_actor_serves_plain_streamed_on_demand_and_gguf(main):
    worker = start_worker(main)
    row = wait_ready(main, f"{HOST}/cpu")
    pids = {p.pid for p in worker.tree()}
    assert row["host"] == HOST and row["pid"] in pids and row["models"] == ["remote-demo"] and row["rss_bytes"] > 0
    # nothing of the worker host listens off its loopback address
    for p in worker.tree():
        for conn in p.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip == "127.0.0.2", (p.pid, conn)
    ps = subprocess.run(
        [sys.executable, "-m", "greenroom", "ps", "--url", main.url], cwd=ROOT, capture_output=True, text=True
    )
    line = next(line.split() for line in ps.stdout.splitlines() if line.startswith(f"{HOST}/cpu "))
    assert line[1] == HOST and int(line[2]) == row["pid"] and line[3] == "ready"

    r = chat(main)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length"), r.text
    client = openai.OpenAI(base_url=main.url + "/v1", api_key="x", max_retries=0, timeout=60)
    chunks = list(
        client.chat.completions.create(
            model="remote-demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
    # a model placed on the remote actor, loaded on its first request
    models = {m["id"]: m for m in httpx.get(main.url + "/api/models", timeout=10).json()["models"]}
    assert models["remote-lazy"]["state"] == "unloaded"
    assert chat(main, "remote-lazy").status_code == 200
    assert "remote-lazy" in main.actors()[f"{HOST}/cpu"]["models"]
    # a second worker under the same name, while the first is connected: refused
    twin = Worker(main.tmp, main.listen_port)
    assert twin.proc.wait(30) == 2 and f"a worker named {HOST!r} is connected" in twin.log()
    assert main.actors()[f"{HOST}/cpu"]["pid"] == row["pid"]
    # a GGUF model's actor, spawned on the worker host
    assert chat(main, "remote-gguf").status_code == 200
    gguf = main.actors()[f"{HOST}/gguf:remote-gguf"]
    assert gguf["host"] == HOST and gguf["pid"] in {p.pid for p in worker.tree()}


def test_auto_placement_replicas_and_keep_alive_across_hosts(main):
    wait_ready(main, f"{HOST}/cpu")
    # actor = "auto" with no engine actor here: loaded on the worker host's, chosen at its first load
    assert models(main)["anywhere"]["actor"] == "auto"
    assert chat(main, "anywhere").status_code == 200
    assert "anywhere" in main.actors()[f"{HOST}/cpu"]["models"] and models(main)["anywhere"]["actor"] == f"{HOST}/cpu"
    # one pooled SDK client, model after model on both hosts, while a stream decodes beside it
    client = openai.OpenAI(base_url=main.url + "/v1", api_key="x", max_retries=0, timeout=60)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(chat, main, "remote-demo", max_tokens=400, **UNENDING)
        for model in ("anywhere", "remote-demo", "pair", "anywhere", "remote-lazy"):
            answer = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            assert answer.choices[0].finish_reason in ("stop", "length") and answer.model == model
        assert beside.result().status_code == 200
    # replicas on two hosts: the preferred one busy, the request goes to the worker host's
    r = routed_while_a_stream_runs(main, "pair")
    assert r.status_code == 200 and r.headers["X-NPU-Proxy-Route-Reason"] == "fallback_busy", r.text
    remote_pair = f"{HOST}/gguf:pair#1"
    assert main.actors()[remote_pair]["models"] == ["pair"] and main.actors()[remote_pair]["host"] == HOST
    # keep_alive 0 unloads on the worker host as here: the model from its actor, a GGUF actor with its model
    assert generate(main, "remote-lazy", keep_alive=0).status_code == 200
    assert generate(main, "pair", keep_alive=0).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        "remote-lazy" in main.actors()[f"{HOST}/cpu"]["models"] or remote_pair in main.actors()
    ):
        time.sleep(0.2)
    assert "remote-lazy" not in main.actors()[f"{HOST}/cpu"]["models"] and remote_pair not in main.actors()
    assert models(main)["remote-lazy"]["state"] == "unloaded"
    ps = {m["name"] for m in httpx.get(main.url + "/api/ps", timeout=10).json()["models"]}
    assert "remote-lazy" not in ps and "pair" not in ps


def fault_mid_stream(main, fault) -> tuple[pytest.ExceptionInfo, float]:
    """A long stream from the remote actor; at its first text, `fault` on every process of the
    worker's tree. The error the stream ended with, and when the fault came."""
    tree = main.workers[-1].tree()
    client = openai.OpenAI(base_url=main.url + "/v1", api_key="x", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="remote-demo", messages=[{"role": "user", "content": "Go"}], max_tokens=3000, stream=True, **UNENDING
    )
    at = None
    with pytest.raises(openai.APIError) as exc:
        for chunk in stream:
            if at is None and chunk.choices and chunk.choices[0].delta.content:
                for p in tree:
                    fault(p)
                at = time.monotonic()
    return exc, at


def test_kill_9_of_the_worker_mid_stream_then_rejoin(main):
    r = httpx.put(
        main.url + "/api/steering",
        json={"model": "remote-demo", "strengths": {SAE_ID: {"7": -120}}},
        timeout=30,
    )
    assert r.json()["live"], r.text
    version, steered = r.json()["version"], chat(main, temperature=0).json()["choices"][0]["message"]["content"]
    exc, killed_at = fault_mid_stream(main, lambda p: p.kill())
    assert time.monotonic() - killed_at < 5.0  # bounded: the link's end, at worst its timeout
    assert exc.value.body["code"] == "engine_crashed" and f"worker host {HOST!r}" in exc.value.body["message"]
    r = chat(main)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded", r.text
    assert f"worker host {HOST!r}" in r.json()["error"]["message"]
    r = chat(main, "remote-gguf")
    assert r.status_code == 503 and f"worker host {HOST!r}" in r.json()["error"]["message"], r.text
    assert nowhere_to_load(chat(main, "anywhere"))  # its host is gone, and no other has room
    assert generate(main, "pair").headers["X-NPU-Proxy-Route-Reason"] == "preferred_device"
    assert main.proc.poll() is None
    # it joins again: served, with the steering it had pushed to the new actor
    start_worker(main)
    wait_ready(main, f"{HOST}/cpu")
    deadline = time.monotonic() + 30
    while not (state := steering(main))["live"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state["live"] and state["version"] == version
    r = chat(main, temperature=0)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == steered
    assert chat(main, "anywhere").status_code == 200  # placed again, on the rejoined host


def test_a_silent_worker_is_lost_within_the_timeout_then_rejoins(main):
    """SIGSTOP of the worker's tree: its link stays open and says nothing, as a cut network would."""
    tree = main.workers[-1].tree()
    try:
        exc, stopped_at = fault_mid_stream(main, lambda p: p.suspend())
        assert time.monotonic() - stopped_at < TIMEOUT_S + 3.0  # silence, then the teardown
        assert exc.value.body["code"] == "engine_crashed" and "nothing received" in exc.value.body["message"]
        r = chat(main)
        assert r.status_code == 503 and f"worker host {HOST!r}" in r.json()["error"]["message"], r.text
    finally:
        for p in tree:
            p.resume()
    wait_ready(main, f"{HOST}/cpu")  # the worker finds its link gone and joins again
    assert chat(main).status_code == 200


def test_sigterm_of_the_main_host_leaves_no_process_on_either_host(main):
    worker = main.workers[-1]
    wait_ready(main, f"{HOST}/cpu")
    pids = [p.pid for p in psutil.Process(main.proc.pid).children(recursive=True)] + [main.proc.pid]
    pids += [p.pid for p in worker.tree()]
    assert main.stop(signal.SIGTERM, timeout_s=20) is not None
    assert worker.proc.wait(20) == 0  # it followed its main host down
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if psutil.pid_exists(p)]


def test_a_worker_whose_main_host_is_not_up_says_so_once_then_joins(tmp_path, model_cache):
    """Started before its main host: one line saying it cannot join, quiet retries with backoff
    (it said "link lost" every 2 s), then the join, said."""
    port = free_port()
    worker = Worker(tmp_path, port, name="early")
    main = None
    try:
        time.sleep(8)  # tries at 0, 1, 3 and 7 s
        main = Server(
            tmp_path,
            model_cache,
            f'engine_actors = []\nnpu_actors = []\nworkers_listen = "127.0.0.1:{port}"\n',
            extra_env={"GREENROOM_WORKER_TOKEN": TOKEN},
        )
        deadline = time.monotonic() + 30
        while "joined the main host" not in worker.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = worker.log()
        assert "joined the main host" in log and log.count("cannot join the main host") == 1, log
        assert "lost" not in log, log
    finally:
        if main is not None:
            main.stop()
        worker.proc.kill()
        worker.proc.wait()


@pytest.mark.parametrize(
    ("engine_actors", "actors", "refusal"),
    [
        (["cpu"], ["cpu", "auto"], 'a replica names its actor ("cpu", "hostb/gpu0"), not "auto"'),
        ([], ["auto"], "this host has none (engine_actors = []) and takes no workers (workers_listen)"),
        ([], ["hostb/cpu"], "is placed on worker host 'hostb', but workers_listen is not set"),
    ],
)
def test_placements_the_tree_refuses_at_start(engine_actors, actors, refusal):
    from greenroom.config import Config, ModelConfig
    from greenroom.supervisor.tree import Tree

    models = [ModelConfig("m", "demo:tiny", actor=actor) for actor in actors]
    with pytest.raises(ValueError) as caught:
        Tree(Config(engine_actors=engine_actors, npu_actors=[], models=models))
    assert refusal in str(caught.value)
