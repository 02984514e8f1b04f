"""No per-request memory growth in the front end or the engine actor (tractor's
Portal.run leaks per call; greenroom multiplexes one stream per actor instead)."""

import httpx
from conftest import MODEL


def test_requests_do_not_grow_memory(server):
    client = httpx.Client(timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def rss():
        actors = server.actors()
        return actors["supervisor"]["rss_bytes"], actors["cpu"]["rss_bytes"]

    for _ in range(100):  # warm caches and allocators
        client.post(server.url + "/v1/chat/completions", json=body)
    before = rss()
    for i in range(500):
        r = client.post(server.url + "/v1/chat/completions", json={**body, "stream": bool(i % 2)})
        assert r.status_code == 200
    after = rss()
    assert after[0] - before[0] < 2 * 2**20, f"front end grew {(after[0] - before[0]) / 2**10:.0f} KiB"
    assert after[1] - before[1] < 2 * 2**20, f"engine actor grew {(after[1] - before[1]) / 2**10:.0f} KiB"
