"""A client that disconnects mid-stream stops its generation at the next decode step."""

import time

import httpx
from conftest import MODEL


def test_disconnect_stops_generation(server):
    before = server.actors()["cpu"]["counters"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk"}], "max_tokens": 1800, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 6:
                break  # leaving the block closes the connection
    counters = server.after_cancel("cpu", before)
    assert counters["cancelled"] == before["cancelled"] + 1
    assert counters["active"] == 0 and counters["queue_depth"] == 0
    generated = counters["tokens_generated"] - before["tokens_generated"]
    assert generated < 200, f"{generated} tokens generated after asking for 1800 and leaving after 5"
    time.sleep(0.5)  # and nothing more is generated afterwards
    assert server.actors()["cpu"]["counters"]["tokens_generated"] == counters["tokens_generated"]
