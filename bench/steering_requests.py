"""What per-request steering costs over HTTP: the same greedy chat request on a server of its
own (tiny demo model, its demo SAE attached), served by the live state (the baseline), with a
`steering_intensity` on the live values, with a `profile`, with a cluster dialled, and with an
active circuit (its X-miLLM-Circuit-Rung read from the front end's cached state). A dialled or
profiled request asks the steering coordinator once (an actor round trip) and runs on the
serial path. Prints the median latency of a 1-token request (the fixed cost) and the tokens/s
of a long one per mode, interleaved, with the ratios to the baseline.

    .venv/bin/python bench/steering_requests.py [--tokens N] [--runs R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import start_server  # noqa: E402

MODEL = "greenroom-demo"
SAE = "sae_demo_tiny_l1"
CONFIG = (
    f'log_level = "warning"\nollama_port = 0\nnpu_actors = []\n[[models]]\nid = "{MODEL}"\n'
    'source = "demo:tiny"\nsae = "demo:tiny"\n'
)
MODES = {  # the request's extra fields; "circuit" runs with a circuit active instead of live values
    "live state": {},
    "steering_intensity": {"steering_intensity": 0.5},
    "profile": {"profile": "bench"},
    "cluster + dial": {"profile": "bench-cluster", "steering_intensity": "max"},
    "active circuit": {},
}


def setup(url: str) -> None:
    def ok(r: httpx.Response) -> None:
        assert r.status_code == 200, r.text

    strengths = {SAE: {"5": 60.0, "9": -30.0}}
    ok(httpx.post(url + "/api/profiles", json={"name": "bench", "model": MODEL, "strengths": strengths}))
    ok(
        httpx.post(
            url + "/api/clusters/import",
            json={
                "format": "greenroom.cluster.v1",
                "name": "bench-cluster",
                "model": MODEL,
                "sae_id": SAE,
                "intensity_range": [0.5, 1.5],
                "members": [{"feature": 5, "strength": 60}, {"feature": 9, "strength": -30}],
            },
        )
    )
    ok(
        httpx.post(
            url + "/api/circuits/import",
            json={
                "format": "greenroom.circuit.v1",
                "name": "bench-circuit",
                "model": MODEL,
                "rung": 2,
                "layers": [{"layer": 1, "members": [{"feature": 5, "strength": 60}]}],
            },
        )
    )


def mode_state(url: str, mode: str) -> None:
    """The live state each mode runs against: the same strengths set directly, or the circuit."""
    if mode == "active circuit":
        r = httpx.post(url + "/api/circuits/bench-circuit/activate", timeout=30)
    else:
        r = httpx.put(
            url + "/api/steering", json={"model": MODEL, "strengths": {SAE: {"5": 60.0, "9": -30.0}}}, timeout=30
        )
    assert r.status_code == 200 and r.json()["live"], r.text


def request(client: httpx.Client, mode: str, tokens: int) -> tuple[float, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "max_tokens": tokens,
        "temperature": 0,
        **MODES[mode],
    }
    start = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - start
    assert r.status_code == 200, r.text
    if mode == "active circuit":
        assert "X-miLLM-Circuit-Rung" in r.headers
    return elapsed, r.json()["usage"]["completion_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    proc, url = start_server(CONFIG)
    try:
        setup(url)
        latency = {mode: [] for mode in MODES}
        speed = {mode: [] for mode in MODES}
        with httpx.Client(base_url=url, timeout=300) as client:
            for mode in MODES:  # warm every path once
                mode_state(url, mode)
                request(client, mode, args.tokens)
            for _ in range(args.runs):
                for mode in MODES:
                    mode_state(url, mode)
                    latency[mode].append(request(client, mode, 1)[0])
                    elapsed, tokens = request(client, mode, args.tokens)
                    speed[mode].append(tokens / elapsed)
        base_latency = statistics.median(latency["live state"])
        base_speed = statistics.median(speed["live state"])
        print(f"{'mode':<20} {'1-token ms':>10} {'Δ ms':>7} {'tok/s':>8} {'ratio':>6}")
        for mode in MODES:
            lat, tps = statistics.median(latency[mode]), statistics.median(speed[mode])
            print(
                f"{mode:<20} {lat * 1000:>10.1f} {(lat - base_latency) * 1000:>+7.1f} {tps:>8.1f} "
                f"{tps / base_speed:>6.3f}"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
