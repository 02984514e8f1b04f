"""Ollama's model management with the real `ollama` client: delete, copy, create (a model
whose system prompt, template, parameters and messages apply on /api/generate and
/api/chat), list and show; and the NPU proxy's /api/models/known and /api/search over the
known-model catalogue. Pulled models come from the fake Hub (tests/fake_hub.py)."""

from __future__ import annotations

import httpx
import ollama
import pytest
from conftest import MODEL, Server
from fake_hub import CONFIG, PUBLIC

from greenroom.engines.demo.demo_model import default_cache_dir

GREEDY = {"num_predict": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache, hub):
    srv = Server(tmp_path_factory.mktemp("models-server"), cache, CONFIG, extra_env={"HF_ENDPOINT": hub.url})
    yield srv
    srv.stop()


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=60)


def names(oc) -> set[str]:
    return {m.model for m in oc.list().models}


def call(server, method, path, body=None, **kw) -> httpx.Response:
    return httpx.request(method, server.url + path, json=body, timeout=60, **kw)


def flat(r, status, code):
    assert r.status_code == status, r.text
    assert r.json()["code"] == code, r.json()
    return r.json()["error"]


# --- copy and delete ----------------------------------------------------------------------------------


def test_copy_is_a_new_name_for_the_same_model(oc, server):
    oc.copy(MODEL, "demo-copy")
    assert {MODEL, "demo-copy"} <= names(oc)
    assert "demo-copy" in [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]
    same = [oc.generate(model=m, prompt="Once upon a time", options=GREEDY).response for m in (MODEL, "demo-copy")]
    assert same[0] == same[1]
    assert oc.show("demo-copy").details.family == oc.show(MODEL).details.family
    flat(call(server, "POST", "/api/copy", {"source": MODEL, "destination": "demo-copy"}), 409, "model_exists")
    flat(call(server, "POST", "/api/copy", {"source": "nosuch", "destination": "x"}), 404, "model_not_found")
    flat(call(server, "POST", "/api/copy", {"source": MODEL}), 400, "missing_parameter")
    flat(call(server, "POST", "/api/copy", {"source": MODEL, "destination": "bad name"}), 400, "invalid_parameter")
    assert oc.delete("demo-copy").status == "success"
    assert "demo-copy" not in names(oc) and MODEL in names(oc)


def test_delete_refuses_configured_and_unknown_models(server):
    flat(call(server, "DELETE", "/api/delete", {"model": MODEL}), 409, "model_configured")
    flat(call(server, "DELETE", "/api/delete", {"model": "nosuch"}), 404, "model_not_found")
    flat(call(server, "DELETE", "/api/delete", {}), 400, "missing_parameter")
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server.url).delete("nosuch")
    assert err.value.status_code == 404


def test_pulled_files_go_with_the_last_name_that_uses_them(oc, server, cache):
    assert oc.pull(PUBLIC).status == "success"
    files = default_cache_dir(cache) / "hub" / PUBLIC
    assert (files / "model.safetensors").is_file()
    oc.copy(PUBLIC, "tiny-copy")
    assert oc.chat(model=PUBLIC, messages=[{"role": "user", "content": "Hi"}], options=GREEDY).done  # loaded
    oc.delete(PUBLIC)
    assert PUBLIC not in names(oc) and (files / "model.safetensors").is_file()  # the copy still uses them
    assert oc.chat(model="tiny-copy", messages=[{"role": "user", "content": "Hi"}], options=GREEDY).done
    oc.delete("tiny-copy")
    assert "tiny-copy" not in names(oc) and not files.exists()
    assert not any(
        m["model"] in (PUBLIC, "tiny-copy") for m in httpx.get(server.url + "/api/ps", timeout=10).json()["models"]
    )
    # a created model that used them, replaced by one made from another model, lets them go too
    oc.pull(PUBLIC)
    oc.create(model="swap", from_=PUBLIC, system="Hi.")
    oc.delete(PUBLIC)
    assert (files / "model.safetensors").is_file()
    oc.create(model="swap", from_=MODEL, system="Hi.")
    assert not files.exists()
    oc.delete("swap")


# --- create ------------------------------------------------------------------------------------------


def test_created_model_applies_its_system_prompt_and_parameters_on_chat(oc):
    frames = list(
        oc.create(
            model="pirate",
            from_=MODEL,
            system="You are a pirate.",
            parameters={"temperature": 0, "num_predict": 6},
            stream=True,
        )
    )
    assert frames[0].status == f"using base model {MODEL}" and frames[-1].status == "success"
    assert "pirate" in names(oc)
    hi = [{"role": "user", "content": "Hello"}]
    made = oc.chat(model="pirate", messages=hi)
    by_hand = oc.chat(
        model=MODEL,
        messages=[{"role": "system", "content": "You are a pirate."}] + hi,
        options={"temperature": 0, "num_predict": 6},
    )
    plain = oc.chat(model=MODEL, messages=hi, options={"temperature": 0, "num_predict": 6})
    assert made.message.content == by_hand.message.content
    assert made.prompt_eval_count == by_hand.prompt_eval_count > plain.prompt_eval_count
    assert made.eval_count <= 6
    # the request's own options win, key by key
    assert oc.chat(model="pirate", messages=hi, options={"num_predict": 2}).eval_count <= 2


def test_created_model_applies_its_template_on_generate_and_messages_on_chat(oc):
    template = (
        "<|im_start|>system\n{{ .System }}<|im_end|>\n<|im_start|>user\n{{ .Prompt }}<|im_end|>\n"
        "<|im_start|>assistant\n{{ .Response }}"
    )
    history = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "A tester."}]
    assert (
        oc.create(
            model="templated",
            from_=MODEL,
            template=template,
            system="Be brief.",
            messages=history,
            parameters={"temperature": 0},
        ).status
        == "success"
    )
    made = oc.generate(model="templated", prompt="Hi", options={"num_predict": 6})
    by_hand = oc.generate(
        model=MODEL, prompt="Hi", template=template, system="Be brief.", options=GREEDY | {"num_predict": 6}
    )
    assert made.response == by_hand.response and made.prompt_eval_count == by_hand.prompt_eval_count
    hi = [{"role": "user", "content": "Hello"}]
    chat = oc.chat(model="templated", messages=hi, options={"num_predict": 6})
    # the chat renders through the template as Ollama renders a legacy one: once per exchange
    prompt = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
        "<|im_start|>assistant\nA tester.<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    by_hand = oc.generate(model=MODEL, prompt=prompt, raw=True, options=GREEDY | {"num_predict": 6})
    assert chat.message.content == by_hand.response and chat.prompt_eval_count == by_hand.prompt_eval_count


def test_create_again_replaces_a_created_model_and_derives_from_one(oc):
    oc.create(model="layered", from_=MODEL, system="First.", parameters={"temperature": 0})
    oc.create(model="layered", from_=MODEL, system="Second.", parameters={"temperature": 0})
    oc.create(model="layered-child", from_="layered", parameters={"num_predict": 4})
    hi = [{"role": "user", "content": "Hello"}]
    child = oc.chat(model="layered-child", messages=hi)
    by_hand = oc.chat(
        model=MODEL,
        messages=[{"role": "system", "content": "Second."}] + hi,
        options={"temperature": 0, "num_predict": 4},
    )
    assert child.message.content == by_hand.message.content and child.eval_count <= 4
    assert oc.create(model="layered", from_=MODEL, stream=False).status == "success"
    oc.delete("layered-child")
    oc.delete("layered")
    assert not {"layered", "layered-child"} & names(oc)


def test_create_with_an_empty_quantize_quantizes_nothing(server, oc):
    """Ollama reads quantize "" as no quantization: made, not refused (any other value is)."""
    r = call(server, "POST", "/api/create", {"model": "unquantized", "from": MODEL, "quantize": "", "stream": False})
    assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
    assert "X-miLLM-Ignored-Fields" not in r.headers
    assert oc.generate(model="unquantized", prompt="Hi", options=GREEDY).response == (
        oc.generate(model=MODEL, prompt="Hi", options=GREEDY).response
    )
    oc.delete("unquantized")


def test_create_refusals(server):
    def create(body):
        return call(server, "POST", "/api/create", {"stream": False, **body})

    flat(create({"model": "x"}), 400, "missing_parameter")  # no `from`
    flat(create({"from": MODEL}), 400, "missing_parameter")  # no name
    flat(create({"model": "x", "from": "nosuch"}), 404, "model_not_found")
    flat(create({"model": MODEL, "from": MODEL}), 409, "model_exists")  # a configured model is never replaced
    flat(create({"model": "x", "from": MODEL, "parameters": {"nosuch": 1}}), 400, "invalid_parameter")
    error = flat(create({"model": "x", "from": MODEL, "parameters": {"temperature": "hot"}}), 400, "invalid_parameter")
    assert "parameters.temperature" in error
    # past msgpack's 64 bits: refused here, not kept to break every chat of the model (the fuzzer's case)
    error = flat(create({"model": "x", "from": MODEL, "parameters": {"top_k": 2**64}}), 400, "invalid_parameter")
    assert "parameters.top_k" in error
    flat(create({"model": "x", "from": MODEL, "template": "{{ .Foo }}"}), 400, "field_not_honoured")
    flat(create({"model": "x", "from": MODEL, "files": {"a.gguf": "sha256:" + "0" * 64}}), 400, "invalid_parameter")
    flat(create({"model": "x", "from": MODEL, "quantize": "q4_K_M"}), 400, "field_not_honoured")
    flat(create({"model": "x", "from": MODEL, "messages": "hi"}), 400, "invalid_parameter")
    assert "x" not in {m["name"] for m in httpx.get(server.url + "/api/tags", timeout=10).json()["models"]}


# --- the known-model catalogue --------------------------------------------------------------------------


def test_known_models_list_the_spec_aliases(server):
    known = httpx.get(server.url + "/api/models/known", timeout=10).json()["models"]
    aliases = {m["ollama_name"] for m in known}
    assert {"tinyllama", "phi-3", "llama3.2", "mistral", "bge-small", "all-minilm"} <= aliases
    assert all("/" in m["huggingface_repo"] and m["type"] in ("llm", "embedding") for m in known)


def test_search_filters_the_catalogue(server):
    def search(**params):
        r = httpx.get(server.url + "/api/search", params=params, timeout=10)
        return r

    every = search().json()
    assert every["total"] == len(every["models"]) >= 6 and every["offset"] == 0 and every["limit"] == 20
    assert {m["ollama_name"] for m in search(q="llama").json()["models"]} >= {"tinyllama", "llama3.2"}
    assert {m["ollama_name"] for m in search(type="embedding").json()["models"]} == {"all-minilm", "bge-small"}
    assert search(type="vision").json() == {"models": [], "total": 0, "limit": 20, "offset": 0}
    assert {m["quantization"] for m in search(quantization="q4_k_m").json()["models"]} == {"Q4_K_M"}
    newest = [m["released"] for m in search(sort="newest").json()["models"]]
    assert newest == sorted(newest, reverse=True)
    page = search(limit=2, offset=1).json()
    assert page["models"] == every["models"][1:3] and page["total"] == every["total"]
    assert search(min_downloads=0).status_code == 200
    flat(search(sort="downloads"), 400, "field_not_honoured")
    flat(search(min_downloads=10), 400, "field_not_honoured")
    flat(search(sort="random"), 400, "invalid_parameter")
    flat(search(limit=0), 400, "invalid_parameter")
    flat(search(limit=101), 400, "invalid_parameter")
    flat(search(offset=-1), 400, "invalid_parameter")
    flat(search(type="audio"), 400, "invalid_parameter")
    assert search(foo=1).headers["X-miLLM-Ignored-Fields"] == '"foo"'


# --- restart (last: it stops the module's server) ------------------------------------------------


def test_copied_and_created_models_survive_a_restart(server, cache, hub, tmp_path):
    oc = ollama.Client(host=server.url, timeout=60)
    oc.pull(PUBLIC)
    oc.copy(PUBLIC, "kept-copy")
    oc.create(model="kept-pirate", from_="kept-copy", system="You are a pirate.", parameters={"temperature": 0})
    hi = [{"role": "user", "content": "Hello"}]
    before = oc.chat(model="kept-pirate", messages=hi, options={"num_predict": 6})
    server.stop()
    again = Server(tmp_path, cache, CONFIG, extra_env={"HF_ENDPOINT": hub.url})
    try:
        oc = ollama.Client(host=again.url, timeout=60)
        assert {PUBLIC, "kept-copy", "kept-pirate"} <= names(oc)
        after = oc.chat(model="kept-pirate", messages=hi, options={"num_predict": 6})
        assert after.message.content == before.message.content
        assert after.prompt_eval_count == before.prompt_eval_count
    finally:
        again.stop()
