"""The actor tree under faults: kill -9 of an engine, SIGTERM/SIGINT of the root, an actor
that cannot load, an actor frozen by SIGSTOP."""

import itertools
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest
from conftest import MODEL, ROOT, UNENDING

from greenroom.supervisor.supervision import HEARTBEAT_S, UNRESPONSIVE_AFTER_S


def openai_client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_kill_engine_mid_stream_errors_restarts_and_serves_again(own_server):
    srv = own_server()
    client = openai_client(srv)
    old_pid = srv.actors()["cpu"]["pid"]
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Go"}], max_tokens=1800, stream=True, **UNENDING
    )
    killed_at = None
    with pytest.raises(openai.APIError) as exc:
        for chunk in stream:
            if killed_at is None and chunk.choices and chunk.choices[0].delta.content:
                os.kill(old_pid, signal.SIGKILL)
                killed_at = time.monotonic()
    assert time.monotonic() - killed_at < 2.0
    assert exc.value.body["code"] == "engine_crashed"
    # the next request waits for the restarted actor and is served
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    cpu = srv.actors()["cpu"]
    assert cpu["state"] == "ready" and cpu["pid"] != old_pid and cpu["restarts"] == 1
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_on_root_leaves_no_process_behind(own_server, sig):
    srv = own_server()
    pids = [a["pid"] for a in srv.actors().values()]
    assert len(set(pids)) == 4  # supervisor, steering, cpu, npu0
    # and a GGUF model's actor, spawned on demand
    r = httpx.post(srv.url + "/api/models/load", json={"model": "greenroom-demo-gguf:Q4_0"}, timeout=60)
    assert r.status_code == 200
    pids = [a["pid"] for a in srv.actors().values()]
    assert len(set(pids)) == 5
    assert srv.stop(sig, timeout_s=20) is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if psutil.pid_exists(p)]


@pytest.mark.parametrize("order", ["group", "children first"])
def test_a_signal_to_the_whole_process_group_is_a_quiet_orderly_shutdown(own_server, order):
    """What systemd's stop and a terminal's Ctrl-C do: SIGTERM to every process of the tree — or
    to the children a moment before the root, as a root busy elsewhere sees it. The tree stops in
    order: exit status 0, nothing logged as an error, no traceback, no process left."""
    srv = own_server(group=True)
    r = httpx.post(srv.url + "/api/models/load", json={"model": "greenroom-demo-gguf:Q4_0"}, timeout=60)
    assert r.status_code == 200
    pids = [a["pid"] for a in srv.actors().values()]
    if order == "group":
        os.killpg(srv.proc.pid, signal.SIGTERM)
    else:
        for pid in pids:
            if pid != srv.proc.pid:
                os.kill(pid, signal.SIGTERM)
        time.sleep(0.5)
        os.kill(srv.proc.pid, signal.SIGTERM)
    assert srv.proc.wait(30) == 0  # one signal each: a second would find the root's handler gone
    log = srv.log_path.read_text(errors="replace")
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if psutil.pid_exists(p)]


BROKEN = """
restart_limit = 1
restart_window_s = 60
engine_actors = ["cpu", "cpu1"]

[[models]]
id = "greenroom-demo"
source = "demo:tiny"
actor = "cpu"

[[models]]
id = "broken"
source = "/nonexistent/checkpoint"
actor = "cpu1"
"""


def test_actor_that_cannot_load_does_not_take_the_server_down(own_server):
    srv = own_server(BROKEN)
    deadline = time.monotonic() + 30
    while srv.actors()["cpu1"]["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.2)
    broken = srv.actors()["cpu1"]
    assert broken["state"] == "failed" and "does not exist" in broken["last_error"]
    ps = subprocess.run([sys.executable, "-m", "greenroom", "ps", "--url", srv.url], capture_output=True, text=True)
    errors = ps.stdout.split("\nLAST ERRORS\n")[1].splitlines()  # greenroom ps says why it failed
    assert [e for e in errors if e.startswith("cpu1: ") and "does not exist" in e], ps.stdout
    client = openai_client(srv)
    with pytest.raises(openai.InternalServerError) as exc:
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 503 and exc.value.code == "model_not_loaded"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.choices[0].message.content is not None


def test_failed_model_is_not_listed(own_server):
    srv = own_server(BROKEN)
    deadline = time.monotonic() + 30
    while srv.actors()["cpu1"]["state"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.2)
    ids = [m.id for m in openai_client(srv).models.list().data]
    assert ids == [MODEL]


SMALL_QUEUE = """
max_queue = 1
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
"""


def test_full_queue_answers_503_queue_full(own_server):
    import concurrent.futures as cf

    srv = own_server(SMALL_QUEUE)
    client = openai_client(srv)

    def one(_):
        try:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=300)
            return 200
        except openai.APIStatusError as exc:
            assert exc.status_code == 503 and exc.code == "queue_full", exc
            return exc.code

    with cf.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(one, range(4)))
    assert 200 in outcomes and "queue_full" in outcomes


def test_queue_full_retry_after_and_needle_429(own_server):
    import concurrent.futures as cf

    import httpx

    srv = own_server(SMALL_QUEUE)
    long = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1500, **UNENDING}

    def occupy(_):
        return httpx.post(srv.url + "/v1/chat/completions", json=long, timeout=120).status_code

    with cf.ThreadPoolExecutor(1) as pool:
        busy = pool.submit(occupy, 0)
        deadline = time.monotonic() + 10
        while srv.actors()["cpu"]["queue_depth"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        v1 = httpx.post(srv.url + "/v1/chat/completions", json={**long, "max_tokens": 2}, timeout=30)
        needle = httpx.post(srv.url + "/v1/needle/complete", json={"query": "x", "max_tokens": 2}, timeout=30)
        api = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": "x", "stream": False}, timeout=30)
        assert busy.result() == 200
    assert v1.status_code == 503 and v1.json()["error"]["code"] == "queue_full" and v1.headers["Retry-After"]
    assert needle.status_code == 429 and needle.json()["error"]["code"] == "engine_busy"
    assert needle.headers["Retry-After"]
    assert api.status_code == 503 and api.json()["code"] == "queue_full" and api.headers["Retry-After"]


def test_request_timeout_is_504_and_cancels(own_server):
    import httpx

    srv = own_server(extra_env={"NEEDLE_REQUEST_TIMEOUT": "0.5"})
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1800, **UNENDING},
    )
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
    deadline = time.monotonic() + 5
    while srv.actors()["cpu"]["counters"]["cancelled"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.actors()["cpu"]["counters"]["active"] == 0
    quick = httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    )
    assert quick.status_code == 200


def test_a_frozen_actor_is_unresponsive_times_out_what_it_has_not_started_and_resumes(own_server):
    srv = own_server()
    client = openai_client(srv)
    pid = srv.actors()["cpu"]["pid"]
    running = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Go"}], max_tokens=1800, stream=True, **UNENDING
    )
    texts = [c.choices[0].delta.content for c in itertools.islice(running, 3)]  # started in the engine
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        with pytest.raises(openai.APIStatusError) as waited:  # sent to the frozen actor: never started
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert time.monotonic() - frozen_at < HEARTBEAT_S + UNRESPONSIVE_AFTER_S + 5.0
        asked = time.monotonic()
        cpu = srv.actors()["cpu"]
        assert time.monotonic() - asked < 1.0  # its status is not waited for
        ps = subprocess.run(
            [sys.executable, "-m", "greenroom", "ps", "--url", srv.url], cwd=ROOT, capture_output=True, text=True
        ).stdout
        with pytest.raises(openai.APIStatusError) as refused:  # while it stays frozen: at once
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False}, timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    for exc in (waited, refused):
        assert exc.value.status_code == 504 and exc.value.code == "request_timeout", exc.value
        assert "'cpu' has not answered" in exc.value.message and "not started" in exc.value.message
    assert r.status_code == 504 and r.json()["code"] == "request_timeout"  # Ollama's envelope
    assert cpu["state"] == "unresponsive" and cpu["pid"] == pid
    assert next(line for line in ps.splitlines() if line.startswith("cpu ")).split()[3] == "unresponsive"
    # it answers again: the started stream ends as it would have, and new requests are served
    texts += [c.choices[0].delta.content or "" for c in running if c.choices]
    assert len("".join(texts)) > 100
    deadline = time.monotonic() + HEARTBEAT_S + 5.0
    while srv.actors()["cpu"]["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.actors()["cpu"]["state"] == "ready"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert srv.actors()["cpu"]["counters"]["cancelled"] >= 1  # the timed-out one did not run after all
    assert "Traceback" not in srv.log()
