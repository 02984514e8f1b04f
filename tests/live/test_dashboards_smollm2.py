"""Feature dashboards and contrast on the real SmolLM2 (transformers, the session's default-config
server). Which test tests what:

- `test_dashboards_of_256_features_in_bounded_time_and_logit_effects_equal_w_dec_w_u`: the default
  SAE `random:576:15` — random directions, so **plumbing only** for the contexts — on real weights:
  the time a 256-feature job takes (printed: the figure in docs/steering.md), and its logit effects
  against W_dec · W_Uᵀ computed here from the checkpoint, to 1e-5.
- `test_contrast_ranks_a_planted_direction_first`: **real structure**: an SAE of random directions
  at layer 10 with one decoder row (and its encoder column) replaced by the direction that
  separates SmolLM2's residuals on prompts about France from others (measured here, in-process, on
  prompts of its own); contrast on *other* such prompts must rank that feature first.
- `test_a_running_job_delays_a_chat_by_at_most_one_decode_step`: chat latency with and without a
  job running (measured, printed), against the model's own decode step.
"""

from __future__ import annotations

import statistics
import time

import httpx
import pytest
import torch

from greenroom.engines.sae import SAE, load_sae, save_sae

from .test_dashboards import call, finished

MODEL = "smollm2-135m-instruct"
SAE_ID = "sae_random_d576_l15"  # the default config's, attached at its first load
PLANTED, WIDTH, LAYER = 137, 256, 10
FRANCE = [
    "Paris is the capital of France.",
    "The Eiffel Tower stands in Paris.",
    "French people eat croissants and baguettes.",
    "Bordeaux wine comes from the south of France.",
]
OTHER = [
    "The stock market fell sharply today.",
    "def add(a, b): return a + b",
    "Photosynthesis turns light into sugar.",
    "The football match ended in a draw.",
]
HELD_FRANCE = ["Lyon is a city in France known for its food.", "The Louvre museum in Paris holds the Mona Lisa."]
HELD_OTHER = ["The recipe calls for two cups of flour.", "Quantum mechanics describes tiny particles."]


@pytest.fixture(scope="module")
def srv(smollm2_server):
    r = httpx.post(smollm2_server.url + "/api/models/load", json={"model": MODEL}, timeout=300)
    assert r.status_code == 200, r.text
    return smollm2_server


@pytest.fixture(scope="module")
def checkpoint(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32), AutoTokenizer.from_pretrained(smollm2)


def test_dashboards_of_256_features_in_bounded_time_and_logit_effects_equal_w_dec_w_u(srv, checkpoint, model_cache):
    from greenroom.engines.random_sae import ensure_random_sae

    started = time.monotonic()
    job = call(
        srv,
        "POST",
        f"/api/saes/{SAE_ID}/dashboards",
        {
            "model": MODEL,
            "features": {"start": 0, "end": 256},
            "corpus": {"seeds": ["The history of Paris begins", "def fibonacci(n):\n"], "generated_tokens": 64},
            "logit_k": 5,
        },
    ).json()
    job = finished(srv, job, timeout_s=300)
    took = time.monotonic() - started
    print(f"256 features, {job['progress']['tokens']} corpus tokens: {took:.1f} s")
    assert job["status"] == "done", job
    assert took < 240
    sae = load_sae(ensure_random_sae(model_cache / "models", "random:576:15")[0])
    model, _ = checkpoint
    effects = sae.W_dec[:256] @ model.lm_head.weight.detach().float().T  # in-process W_dec · W_Uᵀ
    for index in (0, 17, 255):
        feature = call(srv, "GET", f"/api/saes/{SAE_ID}/features/{index}", model=MODEL).json()
        got = [t["value"] for t in feature["logit_effects"]["promoted"] + feature["logit_effects"]["suppressed"]]
        top, bottom = effects[index].topk(5), effects[index].topk(5, largest=False)
        assert [t["id"] for t in feature["logit_effects"]["promoted"]] == top.indices.tolist()
        assert torch.allclose(torch.tensor(got), torch.cat([top.values, bottom.values]), atol=1e-5, rtol=0)
        assert feature["contexts"] and feature["tokens"] > 100


def _planted_sae(checkpoint, folder) -> str:
    """Random unit directions (W_enc = W_decᵀ, no biases), feature PLANTED the France direction."""
    model, tokenizer = checkpoint

    def mean_residual(texts):
        rows = []
        for text in texts:
            ids = tokenizer(text, return_tensors="pt").input_ids
            with torch.no_grad():
                hidden = model(ids, output_hidden_states=True).hidden_states[LAYER + 1][0]  # block LAYER's output
            rows.append(hidden[1:].mean(dim=0))  # the first position (an attention sink) left out
        return torch.stack(rows).mean(dim=0)

    direction = mean_residual(FRANCE) - mean_residual(OTHER)
    generator = torch.Generator().manual_seed(7)
    w_dec = torch.randn(WIDTH, 576, generator=generator)
    w_dec[PLANTED] = direction
    w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
    weights = {"W_dec": w_dec, "W_enc": w_dec.T.contiguous(), "b_enc": torch.zeros(WIDTH), "b_dec": torch.zeros(576)}
    sae = SAE(weights, architecture="standard", hook_name=f"blocks.{LAYER}.hook_resid_post")
    return str(save_sae(folder, sae))


def test_contrast_ranks_a_planted_direction_first(srv, checkpoint, tmp_path):
    path = _planted_sae(checkpoint, tmp_path / "planted")
    r = call(srv, "POST", "/api/saes/attach", {"model": MODEL, "sae": path, "sae_id": "planted"})
    assert r.status_code == 200, r.text
    try:
        r = call(
            srv,
            "POST",
            "/api/saes/planted/contrast",
            {"model": MODEL, "positive": HELD_FRANCE, "negative": HELD_OTHER, "top_k": 3},
        )
        assert r.status_code == 200, r.text
        ranked = r.json()["features"]
        print("contrast:", [(f["index"], round(f["difference"], 3)) for f in ranked])
        assert ranked[0]["index"] == PLANTED
        assert ranked[0]["difference"] > 2 * ranked[1]["difference"]
    finally:
        call(srv, "POST", "/api/saes/detach", {"model": MODEL, "sae_id": "planted"})


def _chat(srv) -> tuple[float, dict]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name a city."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    started = time.monotonic()
    r = call(srv, "POST", "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return time.monotonic() - started, r.json()["x_needle"]


def test_a_running_job_delays_a_chat_by_at_most_one_decode_step(srv):
    _chat(srv)  # warm
    alone = [_chat(srv) for _ in range(6)]
    job = call(
        srv,
        "POST",
        f"/api/saes/{SAE_ID}/dashboards",
        {"model": MODEL, "features": [1, 2], "corpus": {"generated_tokens": 1024}, "max_tokens": 10_000_000},
    ).json()
    try:
        time.sleep(2)
        beside = []
        for _ in range(6):
            time.sleep(0.3)  # the job runs again between the chats
            beside.append(_chat(srv))
        assert call(srv, "GET", f"/api/saes/{SAE_ID}/dashboards/{job['id']}").json()["status"] == "running"
    finally:
        call(srv, "DELETE", f"/api/saes/{SAE_ID}/dashboards/{job['id']}")
    step = statistics.median(1 / needle["decode_tps"] for _, needle in alone)
    latency = statistics.median(t for t, _ in alone), statistics.median(t for t, _ in beside)
    waited = statistics.median(needle["queue_wait_seconds"] for _, needle in beside)
    waited_alone = statistics.median(needle["queue_wait_seconds"] for _, needle in alone)
    print(
        f"decode step {step * 1000:.1f} ms; chat latency {latency[0] * 1000:.0f} ms alone, "
        f"{latency[1] * 1000:.0f} ms beside a job; queue wait {waited_alone * 1000:.1f} → {waited * 1000:.1f} ms"
    )
    # what the job adds is the wait for its step in progress when the chat came: at most one step
    assert waited - waited_alone <= step * 1.5 + 0.005
    assert latency[1] - latency[0] <= step * 1.5 + 0.02
