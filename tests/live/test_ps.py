"""`greenroom ps` prints the live tree from another process: the server's URLs and uptime, its
actors, every configured model with its state (loaded or not), and the actors' last errors
(tests/live/test_lifecycle.py shows one)."""

import json
import re
import subprocess
import sys

import httpx
from conftest import ROOT


def greenroom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "greenroom", *args], cwd=ROOT, capture_output=True, text=True)


def test_ps_shows_the_server_its_actors_and_every_model(server):
    done = greenroom("ps", "--url", server.url.removeprefix("http://"))  # host:port, as people type it
    assert done.returncode == 0, done.stderr
    head, actors, models = done.stdout.strip().split("\n\n")[:3]
    assert re.match(rf"greenroom \S+ \(pid {server.proc.pid}\) on {re.escape(server.url)}, up \d", head), head
    rows = {line.split()[0]: line.split() for line in actors.splitlines()[1:]}
    assert {"supervisor", "steering", "cpu"} <= set(rows) and "scheduler" not in rows  # no scheduler process
    assert rows["cpu"][1] == rows["supervisor"][1]  # both on this host
    assert rows["cpu"][2] != rows["supervisor"][2]
    assert int(rows["supervisor"][2]) == server.proc.pid
    assert rows["cpu"][3] == "ready" and "greenroom-demo" in rows["cpu"][-1].split(",")
    assert models.splitlines()[0].split() == ["MODEL", "STATE", "ENGINE", "SIZE", "MB", "ACTOR"]
    rows = {line.split()[0]: line.split() for line in models.splitlines()[1:]}
    states = {model: row[1] for model, row in rows.items()}
    served = httpx.get(server.url + "/api/models", timeout=10).json()["models"]
    assert states == {m["id"]: m["state"] for m in served}  # loaded or not: every configured model
    assert states["greenroom-demo"] == "loaded" and states["smollm2-135m-instruct"] in ("unloaded", "loaded")
    # a loaded model's size is what its actor reported it takes; an unloaded one's is unknown
    footprints = {m["id"]: m["footprint_bytes"] for m in served}
    assert int(rows["greenroom-demo"][3]) == round(footprints["greenroom-demo"] / 2**20) > 0
    assert all(row[3] == "-" for model, row in rows.items() if states[model] == "unloaded")
    swap = done.stdout.strip().split("\n\n")[3].splitlines()  # the swap's limits, then each device's models
    assert swap[0] == (
        "swap: max_loaded_models unlimited, memory_budget available memory, evict_pinned true, gguf_parallel 4, "
        "max_queue 32"
    )
    assert any(line.startswith("cpu: ") and "greenroom-demo" in line for line in swap[1:]), swap


def test_version():
    done = greenroom("--version")
    assert done.returncode == 0 and re.fullmatch(r"greenroom \d+\.\d+\.\d+\n", done.stdout), done.stdout


def test_ps_json_has_the_server_the_actors_and_the_models(server):
    done = greenroom("ps", "--url", server.url, "--json")
    shown = json.loads(done.stdout)
    assert shown["server"]["listening"] == [server.url] and shown["server"]["uptime_s"] > 0
    assert {"supervisor", "cpu"} <= {a["name"] for a in shown["actors"]}
    assert "smollm2-135m-instruct" in {m["id"] for m in shown["models"]}


def test_ps_without_server_says_so():
    r = greenroom("ps", "--url", "127.0.0.1:9")
    assert r.returncode == 1 and "no server answered at http://127.0.0.1:9" in r.stderr
