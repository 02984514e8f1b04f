"""vLLM's /tokenize and /detokenize (http/openai/tokenize_api.py) on every engine of the session's
server: a prompt as /v1/completions tokenises it, messages as chat completions render them (the
prompt_tokens a chat completion reports), ids back to text; typed refusals."""

from __future__ import annotations

import httpx
import pytest
from conftest import MODEL

GGUF = "greenroom-demo-gguf:Q8_0"
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_tokenize_and_back(server, model):
    def post(path: str, body: dict) -> dict:
        r = httpx.post(server.url + path, json={"model": model, **body}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    prompt = post("/tokenize", {"prompt": "Hello there", "return_token_strs": True})
    assert prompt["count"] == len(prompt["tokens"]) == len(prompt["token_strs"]) and prompt["max_model_len"] > 0
    assert "".join(prompt["token_strs"]).endswith("Hello there")
    completion = post("/v1/completions", {"prompt": "Hello there", "max_tokens": 1})
    assert completion["usage"]["prompt_tokens"] == prompt["count"]
    bare = post("/tokenize", {"prompt": "Hello there", "add_special_tokens": False})
    assert bare["tokens"] == prompt["tokens"][-bare["count"] :]
    assert post("/detokenize", {"tokens": bare["tokens"]})["prompt"] == "Hello there"
    chat = post("/tokenize", {"messages": HELLO})
    assert chat["token_strs"] is None
    strs = post("/tokenize", {"messages": HELLO, "return_token_strs": True})["token_strs"]
    assert len(strs) == chat["count"] and all(strs)  # a special token's own text is written out too
    assert "".join(strs).endswith("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
    answered = post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 1})
    assert answered["usage"]["prompt_tokens"] == chat["count"] > prompt["count"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    assert post("/tokenize", {"messages": HELLO, "tools": [tool]})["count"] > chat["count"]
    standing = post("/tokenize", {"messages": HELLO, "add_generation_prompt": False})  # no assistant turn opened
    assert chat["tokens"][: standing["count"]] == standing["tokens"] and standing["count"] < chat["count"]


@pytest.mark.parametrize(
    "path,body,code,param",
    [
        ("/tokenize", {}, "invalid_parameter", "prompt"),
        ("/tokenize", {"prompt": "x", "messages": HELLO}, "invalid_parameter", "prompt"),
        ("/tokenize", {"prompt": 3}, "invalid_parameter", "prompt"),
        ("/tokenize", {"messages": [{"role": "nobody"}]}, "invalid_parameter", "messages[0].role"),
        ("/tokenize", {"messages": HELLO, "add_generation_prompt": "no"}, "invalid_parameter", "add_generation_prompt"),
        ("/detokenize", {}, "missing_parameter", "tokens"),
        ("/detokenize", {"tokens": ["a"]}, "invalid_parameter", "tokens"),
        ("/detokenize", {"tokens": [10**6]}, "invalid_parameter", "tokens"),
    ],
)
def test_refusals_are_typed_400s(server, path, body, code, param):
    r = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param, r.text
