"""Scoring mode (completions and chat): numbers against a direct torch computation,
the OpenAI shapes, and every refusal of the spec."""

import json
import shutil

import httpx
import pytest
import torch
from conftest import MODEL
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from greenroom.engines.demo.demo_model import default_cache_dir, ensure_demo_model

PROMPT = "[kind] noul\n[question] is it true?\n[decision]:"


@pytest.fixture(scope="module")
def reference(model_cache):
    path = ensure_demo_model(default_cache_dir())
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def torch_logprobs(reference, ids, temperature=1.0, allowed=None):
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    if allowed is not None:
        logits = logits[allowed]
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def completion(server, **kw):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_scoring_matches_torch(server, reference):
    _, tok = reference
    ids = tok.encode(PROMPT)
    for temperature in (1.0, 0.7, 0):
        body = completion(server, logprobs=5, temperature=temperature, return_tokens_as_token_ids=True)
        expected = torch_logprobs(reference, ids, temperature)
        top = torch.topk(expected, 5)
        lp = body["choices"][0]["logprobs"]
        assert lp["tokens"] == [f"token_id:{int(top.indices[0])}"]
        assert lp["token_logprobs"][0] == pytest.approx(float(top.values[0]), abs=1e-5)
        got = lp["top_logprobs"][0]
        assert set(got) == {f"token_id:{int(i)}" for i in top.indices}
        for i, v in zip(top.indices, top.values):
            assert got[f"token_id:{int(i)}"] == pytest.approx(float(v), abs=1e-5)
        assert lp["text_offset"] == [len(PROMPT)]
        assert body["choices"][0]["text"] == tok.decode([int(top.indices[0])])
        assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 1


def test_allowed_token_ids_renormalise_and_every_listed_token_is_returned(server, reference):
    _, tok = reference
    allowed = [300, 400, 500, 600]
    body = completion(
        server, logprobs=1, allowed_token_ids=allowed, return_tokens_as_token_ids=True, add_special_tokens=False
    )
    expected = torch_logprobs(reference, tok.encode(PROMPT, add_special_tokens=False), allowed=allowed)
    got = body["choices"][0]["logprobs"]["top_logprobs"][0]
    assert set(got) == {f"token_id:{t}" for t in allowed}
    for t, v in zip(allowed, expected):
        assert got[f"token_id:{t}"] == pytest.approx(float(v), abs=1e-5)
    assert sum(torch.tensor(list(got.values())).exp()) == pytest.approx(1.0, abs=1e-5)
    best = allowed[int(torch.argmax(expected))]
    assert body["choices"][0]["logprobs"]["tokens"] == [f"token_id:{best}"]
    assert body["usage"]["prompt_tokens"] == len(tok.encode(PROMPT, add_special_tokens=False))


def test_allowed_without_logprobs_constrains_and_returns_null(server, reference):
    _, tok = reference
    body = completion(server, allowed_token_ids=[300, 400])
    expected = torch_logprobs(reference, tok.encode(PROMPT), allowed=[300, 400])
    assert body["choices"][0]["logprobs"] is None
    assert body["choices"][0]["text"] == tok.decode([[300, 400][int(torch.argmax(expected))]])


def test_text_keys_and_several_prompts(server):
    body = completion(server, prompt=["a b c", "d e f"], logprobs=3)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for c in body["choices"]:
        assert c["logprobs"]["tokens"][0] == c["text"]
        assert c["text"] in c["logprobs"]["top_logprobs"][0]


def test_chat_scoring_equals_completion_scoring_of_the_rendered_prompt(server, reference):
    _, tok = reference
    messages = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Is the sky green?"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    allowed = [300, 400, 500]
    chat = post(
        server,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": 3,
            "allowed_token_ids": allowed,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    comp = completion(
        server,
        prompt=rendered,
        add_special_tokens=False,
        logprobs=3,
        allowed_token_ids=allowed,
        return_tokens_as_token_ids=True,
    )
    content = chat["choices"][0]["logprobs"]["content"][0]
    comp_lp = comp["choices"][0]["logprobs"]
    assert content["token"] == comp_lp["tokens"][0]
    assert content["logprob"] == comp_lp["token_logprobs"][0]
    assert {t["token"]: t["logprob"] for t in content["top_logprobs"]} == comp_lp["top_logprobs"][0]
    assert content["bytes"] == list(chat["choices"][0]["message"]["content"].encode())
    expected = torch_logprobs(reference, tok.encode(rendered, add_special_tokens=False), allowed=allowed)
    assert content["logprob"] == pytest.approx(float(expected.max()), abs=1e-5)


def test_chat_scoring_top_logprobs_counts_and_null(server):
    base = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    two = post(server, "/v1/chat/completions", {**base, "logprobs": True, "top_logprobs": 2}).json()
    assert len(two["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    none = post(server, "/v1/chat/completions", {**base, "logprobs": True}).json()
    assert none["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    capped = post(
        server, "/v1/chat/completions", {**base, "logprobs": True, "top_logprobs": 5, "allowed_token_ids": [300, 400]}
    ).json()
    assert len(capped["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    constrained = post(server, "/v1/chat/completions", {**base, "allowed_token_ids": [300, 400]}).json()
    assert constrained["choices"][0]["logprobs"] is None


def test_extra_messages_one_choice_each_in_order(server):
    convs = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    body = {
        "model": MODEL,
        "messages": convs[0],
        "extra_messages": convs[1:],
        "max_tokens": 1,
        "logprobs": True,
        "seed": 5,
    }
    r = post(server, "/v1/chat/completions", body)
    assert r.headers["X-miLLM-Seed"] == '5;scope="batch-shape"'
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for i, conv in enumerate(convs):
        single = post(
            server, "/v1/chat/completions", {"model": MODEL, "messages": conv, "max_tokens": 1, "logprobs": True}
        ).json()["choices"][0]
        assert single["logprobs"] == choices[i]["logprobs"]


def test_failing_extra_conversation_names_its_index(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a"}],
        "max_tokens": 1,
        "logprobs": True,
        "extra_messages": [[{"role": "user", "content": "b"}], [{"role": "robot", "content": "c"}]],
    }
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and "extra_messages[1]" in r.json()["error"]["message"]


def test_scoring_requests_are_reported_not_applicable_fields(server):
    r = post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 1, "logprobs": 1, "top_p": 0.5, "stop": ["a"]},
    )
    assert r.status_code == 200 and r.headers["X-miLLM-Ignored-Fields"] == '"top_p", "stop"'


def refusal(server, path, body, status, code, param=None):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    if param:
        assert err["param"] == param or param in err["message"], err


COMP = {"model": MODEL, "prompt": "x", "max_tokens": 1, "logprobs": 2}
CHATS = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": True}


@pytest.mark.parametrize(
    "path,body,status,code,param",
    [
        # max_tokens other than 1 (the spec refuses it): a generation with logprobs, test_logprobs.py
        ("/v1/completions", {**COMP, "max_tokens": 100}, 200, None, None),
        ("/v1/completions", {**COMP, "max_tokens": None}, 200, None, None),
        ("/v1/completions", {**COMP, "max_tokens": None, "max_completion_tokens": 1}, 200, None, None),
        (
            "/v1/completions",
            {**COMP, "allowed_token_ids": [5], "max_tokens": 2},
            400,
            "invalid_scoring_request",
            "max_tokens",
        ),
        ("/v1/completions", {**COMP, "n": 2}, 400, "field_not_honoured", "n"),
        ("/v1/completions", {**COMP, "logprobs": 21}, 400, "invalid_parameter", "logprobs"),
        (
            "/v1/completions",
            {**COMP, "allowed_token_ids": [5, 10**7]},
            400,
            "invalid_scoring_request",
            "allowed_token_ids",
        ),
        ("/v1/completions", {**COMP, "allowed_token_ids": [-1]}, 400, "invalid_scoring_request", "allowed_token_ids"),
        (
            "/v1/completions",
            {**COMP, "prompt": "", "add_special_tokens": False},
            400,
            "invalid_scoring_request",
            "prompt",
        ),
        ("/v1/completions", {**COMP, "temperature": 0.0005}, 400, "invalid_parameter", "temperature"),
        ("/v1/completions", {**COMP, "temperature": 0.001}, 200, None, None),
        ("/v1/completions", {**COMP, "stream": True}, 400, "invalid_scoring_request", "stream"),
        ("/v1/completions", {**COMP, "profile": "p"}, 400, "field_not_honoured", "profile"),
        (
            "/v1/completions",
            {**COMP, "response_format": {"type": "json_object"}},
            400,
            "field_not_honoured",
            "response_format",
        ),
        ("/v1/chat/completions", {**CHATS, "max_tokens": 2}, 200, None, None),  # a generation with logprobs
        (
            "/v1/chat/completions",
            {**CHATS, "allowed_token_ids": [5], "max_tokens": 2},
            400,
            "invalid_scoring_request",
            "max_tokens",
        ),
        ("/v1/chat/completions", {**CHATS, "n": 2}, 400, "invalid_scoring_request", "n"),
        ("/v1/chat/completions", {**CHATS, "stream": True}, 400, "invalid_scoring_request", "stream"),
        ("/v1/chat/completions", {**CHATS, "temperature": 0.0001}, 400, "invalid_parameter", "temperature"),
        (
            "/v1/chat/completions",
            {**CHATS, "logprobs": False, "top_logprobs": 2},
            400,
            "invalid_parameter",
            "top_logprobs",
        ),
        ("/v1/chat/completions", {**CHATS, "top_logprobs": 21}, 400, "invalid_parameter", "top_logprobs"),
        (
            "/v1/chat/completions",
            {**CHATS, "allowed_token_ids": [10**7]},
            400,
            "invalid_scoring_request",
            "allowed_token_ids",
        ),
        ("/v1/chat/completions", {**CHATS, "profile": "p"}, 400, "field_not_honoured", "profile"),
        ("/v1/chat/completions", {**CHATS, "steering_intensity": 1}, 400, "field_not_honoured", "steering_intensity"),
        ("/v1/chat/completions", {**CHATS, "steering": {"1": 2}}, 400, "field_not_honoured", "steering"),
        (
            "/v1/chat/completions",
            {**CHATS, "response_format": {"type": "json_object"}},
            400,
            "field_not_honoured",
            "response_format",
        ),
    ],
)
def test_scoring_refusals(server, path, body, status, code, param):
    if status == 200:
        assert post(server, path, body).status_code == 200
    else:
        refusal(server, path, body, status, code, param)


@pytest.fixture(scope="module")
def special_models(tmp_path_factory, model_cache):
    """Copies of the demo model: one without a chat template; one whose output matrix
    makes token 300's logit +inf and token 400's -inf (hidden channel 0 is a constant > 0)."""
    src = ensure_demo_model(default_cache_dir())
    root = tmp_path_factory.mktemp("special")
    plain = root / "no-template"
    shutil.copytree(src, plain)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    broken = root / "non-finite"
    shutil.copytree(src, broken)
    weights = load_file(broken / "model.safetensors")
    head = weights["lm_head.weight"]
    head[300] = 0
    head[300, 0] = float("inf")
    head[400] = 0
    head[400, 0] = float("-inf")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    return plain, broken


def test_no_chat_template_and_non_finite_logits(own_server, special_models):
    plain, broken = special_models
    srv = own_server(f"""
[[models]]
id = "greenroom-demo"
source = "demo:tiny"
[[models]]
id = "plain"
source = "{plain}"
[[models]]
id = "broken"
source = "{broken}"
""")
    refusal(srv, "/v1/chat/completions", {**CHATS, "model": "plain"}, 400, "no_chat_template")
    # generation keeps its generic fallback is not promised here; completion scoring still works
    assert post(srv, "/v1/completions", {**COMP, "model": "plain"}).status_code == 200
    b = {**COMP, "model": "broken"}
    refusal(srv, "/v1/completions", b, 500, "non_finite_logits")  # +inf anywhere, unrestricted
    refusal(srv, "/v1/completions", {**b, "allowed_token_ids": [300, 500]}, 500, "non_finite_logits")  # +inf allowed
    refusal(srv, "/v1/completions", {**b, "allowed_token_ids": [400, 500]}, 500, "non_finite_logits")  # -inf reported
    ok = post(srv, "/v1/completions", {**b, "allowed_token_ids": [500, 600]})  # ±inf outside the set is fine
    assert ok.status_code == 200, ok.text
    chat_ok = post(
        srv, "/v1/chat/completions", {**CHATS, "model": "broken", "allowed_token_ids": [400, 500], "top_logprobs": 1}
    )  # -inf allowed but not reported
    assert chat_ok.status_code == 200, chat_ok.text
