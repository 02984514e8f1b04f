"""Bounded load: 200 concurrent clients against a small queue. Every request ends in 200 or
a typed 503 queue_full (with Retry-After); none hangs; memory returns to its baseline."""

import asyncio
import collections

import httpx
from conftest import MODEL

SMALL = 'max_queue = 8\n[[models]]\nid = "greenroom-demo"\nsource = "demo:tiny"\n'


async def storm(url: str, n: int) -> collections.Counter:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int) -> str:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"client {i}"}],
                "max_tokens": 16,
                "stream": i % 2 == 0,
            }
            r = await client.post(url + "/v1/chat/completions", json=body)
            if r.status_code == 200:
                assert r.text.endswith("data: [DONE]\n\n") if body["stream"] else r.json()["choices"]
                return "200"
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            return r.json()["error"]["code"]

        return collections.Counter(await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 300))


def test_200_concurrent_clients(own_server):
    srv = own_server(SMALL)
    asyncio.run(storm(srv.url, 200))  # the first storm sizes the allocators' arenas: that is the baseline
    before = {name: a["rss_bytes"] for name, a in srv.actors().items()}
    outcomes = asyncio.run(storm(srv.url, 200))
    assert set(outcomes) <= {"200", "queue_full"} and sum(outcomes.values()) == 200
    assert outcomes["200"] >= 8 and outcomes["queue_full"] > 0, outcomes
    cpu = srv.actors()["cpu"]
    assert cpu["counters"]["active"] == 0 and cpu["queue_depth"] == 0
    after = {name: a["rss_bytes"] for name, a in srv.actors().items()}
    print(dict(outcomes), {n: round((after[n] - before[n]) / 2**20, 1) for n in ("supervisor", "cpu")}, "MiB")
    for name in ("supervisor", "cpu"):
        assert after[name] - before[name] < 4 * 2**20, (name, (after[name] - before[name]) / 2**20)
    assert (
        httpx.post(
            srv.url + "/v1/chat/completions",
            timeout=60,
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        ).status_code
        == 200
    )
