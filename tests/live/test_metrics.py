"""GET /metrics: Prometheus text with requests, tokens, TTFT and inter-token histograms,
queue depth per actor, actor lifecycle events."""

import re

import httpx
from conftest import MODEL


def sample(text: str, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"no sample {name}{{{want}}}")


def test_metrics(server, client):
    before = httpx.get(server.url + "/metrics").text
    tokens_before = (
        sample(before, "greenroom_tokens_generated_total", model=MODEL)
        if "greenroom_tokens_generated_total{" in before
        else 0.0
    )
    list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=7, stream=True
        )
    )
    client.completions.create(model=MODEL, prompt="x", max_tokens=5)
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert sample(text, "greenroom_requests_total", route="/v1/chat/completions", method="POST", status="200") >= 1
    assert sample(text, "greenroom_tokens_generated_total", model=MODEL) - tokens_before == 12
    assert sample(text, "greenroom_time_to_first_token_seconds_count", model=MODEL) >= 2
    assert sample(text, "greenroom_inter_token_seconds_count", model=MODEL) >= 1
    assert sample(text, "greenroom_queue_depth", actor="cpu") == 0
    assert sample(text, "greenroom_actor_events_total", actor="cpu", event="started") >= 1
    httpx.get(server.url + "/nowhere")
    assert (
        sample(httpx.get(server.url + "/metrics").text, "greenroom_requests_total", route="unmatched", status="404")
        >= 1
    )
