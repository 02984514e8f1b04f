"""`greenroom ps` prints the live tree from another process."""

import subprocess
import sys

from conftest import ROOT


def test_ps_shows_engine_actor_in_its_own_process(server):
    out = subprocess.run(
        [sys.executable, "-m", "greenroom", "ps", "--url", server.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert {"supervisor", "scheduler", "steering", "cpu"} <= set(rows)
    assert rows["cpu"][1] == rows["supervisor"][1]  # both on this host
    assert rows["cpu"][2] != rows["supervisor"][2]
    assert int(rows["supervisor"][2]) == server.proc.pid
    assert rows["cpu"][3] == "ready" and "greenroom-demo" in rows["cpu"][-1].split(",")


def test_ps_without_server_says_so():
    r = subprocess.run(
        [sys.executable, "-m", "greenroom", "ps", "--url", "http://127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "no server answered" in r.stderr
