"""A client that disconnects mid-stream stops its generation at the next decode step."""

import time

import httpx
from conftest import MODEL, UNENDING


def test_disconnect_stops_generation(server):
    before = server.actors()["cpu"]["counters"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Talk"}],
        "max_tokens": 1800,
        "stream": True,
        **UNENDING,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 6:
                break  # leaving the block closes the connection
    # chunks carry what came meanwhile (actors/outbox.py, http/core/pacing.py), so what the client had
    # is not a token count: what counts is how far the engine went after it left
    left = server.actors()["cpu"]["counters"]["tokens_generated"]
    counters = server.after_cancel("cpu", before)
    assert counters["cancelled"] == before["cancelled"] + 1
    assert counters["active"] == 0 and counters["queue_depth"] == 0
    after = counters["tokens_generated"] - left
    assert after < 200, f"{after} tokens generated after the client left (1800 asked for)"
    time.sleep(0.5)  # and nothing more is generated afterwards
    assert server.actors()["cpu"]["counters"]["tokens_generated"] == counters["tokens_generated"]
