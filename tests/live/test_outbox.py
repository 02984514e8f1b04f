"""The engine actor's worker sends a running stream's tokens itself (greenroom/actors/outbox.py):
its trio loop sleeps through the stream, the text still arrives as it is made, and the loop's
own answers meanwhile leave it whole."""

import json
import threading
import time
from pathlib import Path

import httpx
from conftest import MODEL, UNENDING


def _switches(pid: int) -> int:
    """How often the actor's loop thread (its main thread) has left the CPU."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines()
    return sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)


def _stream_body(content: str, max_tokens: int) -> dict:
    """A streamed chat that runs its whole `max_tokens` (UNENDING), usage in its last chunk."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **UNENDING,
    }


def test_a_stream_leaves_the_engine_loop_asleep_and_its_text_flows(server):
    pid = server.actors()["cpu"]["pid"]
    body = _stream_body("Talk", 400)
    before, start = _switches(pid), time.monotonic()
    arrivals = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith('data: {"') and '"content":"' in line:
                arrivals.append(time.monotonic() - start)
    took, woken = time.monotonic() - start, _switches(pid) - before
    # the text came in many chunks over the stream, the first long before the last
    assert len(arrivals) >= 10 and arrivals[0] < took / 3, (len(arrivals), arrivals[:3], took)
    # polling every 10 ms, the loop left the CPU twice a poll (~80 times a second); now the
    # request's arrival and the front end's status queries (one each 2 s) wake it
    assert woken <= 6 + 4 * took, f"the loop thread switched {woken} times in {took:.2f} s"


def _streamed_text(url: str, body: dict) -> tuple[str, int]:
    text, usage = [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                text += [c["delta"].get("content") or "" for c in chunk["choices"]]
                usage = chunk.get("usage") or usage
    return "".join(text), usage["completion_tokens"]


def test_status_answered_meanwhile_leaves_the_stream_whole_and_in_order(server):
    """The loop's answers (status, ~50 a stream here) share the socket with the worker's writes,
    and take the worker's events over when they meet: the same greedy text, every token, in order."""
    body = _stream_body("Count", 300)
    alone = _streamed_text(server.url, body)
    done, answers = threading.Event(), []

    def ask():
        while not done.is_set():
            answers.append(server.actors()["cpu"]["counters"] is not None)

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        beside = _streamed_text(server.url, body)
    finally:
        done.set()
        asker.join()
    assert alone[1] == 300 and beside == alone
    assert len(answers) >= 3 and all(answers)
