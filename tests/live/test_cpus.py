"""An engine actor computing on one thread keeps to a CPU of its own (greenroom/cpus.py)."""

import os

import httpx
from conftest import MODEL

from greenroom.cpus import CpuPool
from greenroom.engines.base import default_cpu_threads

SERVER_CPUS = sorted(os.sched_getaffinity(0))


def test_the_pool_gives_the_highest_free_cpu_and_never_the_first():
    pool = CpuPool(cpus=[0, 1, 2])
    assert pool.take("a") == 2
    assert pool.take("a") == 2  # the same actor's restart keeps its CPU
    assert pool.take("b") == 1
    assert pool.take("c") is None  # CPU 0 is the front end's
    pool.give("a")
    assert pool.take("c") == 2
    assert pool.held == {"b": 1, "c": 2}
    pool.give("nobody")  # an actor that held none gives nothing back
    assert CpuPool(cpus=[0]).take("a") is None
    assert CpuPool(enabled=False, cpus=[0, 1]).take("a") is None


def _engine_cpus(server) -> set[int]:
    pid = server.actors()["cpu"]["pid"]
    return os.sched_getaffinity(pid)


def test_the_served_engine_actor_is_pinned_where_it_computes_on_one_thread(server):
    pinned = default_cpu_threads() == 1 and len(SERVER_CPUS) > 1
    assert _engine_cpus(server) == ({SERVER_CPUS[-1]} if pinned else set(SERVER_CPUS))
    # and it serves, streamed, as before
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert sum(line.startswith("data: {") for line in r.iter_lines()) >= 2


def test_pin_cpus_off_leaves_every_actor_to_the_scheduler(own_server):
    srv = own_server(f'pin_cpus = false\n[[models]]\nid = "{MODEL}"\nsource = "demo:tiny"\n')
    assert _engine_cpus(srv) == set(SERVER_CPUS)
