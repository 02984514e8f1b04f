"""Chat templates: a model without one (no_chat_template on chat, the prompt as it is on
/api/generate, as Ollama's `{{ .Prompt }}`), a [[models]] entry's own `chat_template` (inline
or a file, any engine), and what templates receive (content null rendered as "", the ids that
pair tool results with their calls)."""

import json
import shutil

import httpx
import ollama
import pytest
from conftest import Server

CONCATENATING = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ONLY_CONTENT = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
# renders each call's id and the id a result names, as templates that pair them (Mistral's) do
IDS = (
    "{% for m in messages %}{{ m['role'] }}:{% for c in m['tool_calls'] or [] %}[{{ c['id'] }}]{% endfor %}"
    "{{ m['tool_call_id'] if m['tool_call_id'] is defined else '' }}={{ m['content'] }};{% endfor %}"
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model_cache):
    tmp = tmp_path_factory.mktemp("templates")
    bare = tmp / "bare"  # the demo checkpoint without its chat template
    shutil.copytree(model_cache / "models" / "greenroom-demo-tiny", bare)
    (bare / "chat_template.jinja").unlink()
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp / "concatenating.jinja").write_text(CONCATENATING)
    (tmp / "ids.jinja").write_text(IDS)
    toml = (
        f'[[models]]\nid = "bare"\nsource = "{bare}"\n'
        f'[[models]]\nid = "inline"\nsource = "{bare}"\nchat_template = "{ONLY_CONTENT}"\npreload = false\n'
        f'[[models]]\nid = "gguf-file-template"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\n'
        f'chat_template = "{tmp / "concatenating.jinja"}"\n'
        f'[[models]]\nid = "ids"\nsource = "{bare}"\nchat_template = "{tmp / "ids.jinja"}"\npreload = false\n'
        f'[[models]]\nid = "gguf-ids"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\n'
        f'chat_template = "{tmp / "ids.jinja"}"\n'
    )
    server = Server(tmp, model_cache, toml)
    yield server
    server.stop()


def chat(srv, model, messages, **extra):
    return httpx.post(
        srv.url + "/v1/chat/completions",
        timeout=60,
        json={"model": model, "messages": messages, "max_tokens": 3, **extra},
    )


def test_chat_without_a_template_is_no_chat_template_on_both_surfaces(srv):
    r = chat(srv, "bare", [{"role": "user", "content": "hi"}])
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_chat_template", r.text
    assert "chat_template" in r.json()["error"]["message"]
    r = httpx.post(
        srv.url + "/api/chat",
        timeout=60,
        json={"model": "bare", "stream": False, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["code"] == "no_chat_template"


def test_generate_without_a_template_sends_the_prompt_as_it_is(srv, model_cache):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_cache / "models" / "greenroom-demo-tiny")
    r = httpx.post(
        srv.url + "/api/generate",
        timeout=60,
        json={
            "model": "bare",
            "stream": False,
            "prompt": "Once upon a time",
            "system": "Be brief.",
            "options": {"num_predict": 3},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == len(tokenizer.encode("Once upon a time"))  # BOS + the prompt
    assert '"system"' in r.headers["X-miLLM-Ignored-Fields"]  # {{ .Prompt }} has no place for it
    reply = ollama.Client(host=srv.url).generate(model="bare", prompt="Once upon a time", options={"num_predict": 3})
    assert reply.done


def test_an_inline_chat_template_replaces_the_models(srv, model_cache):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_cache / "models" / "greenroom-demo-tiny")
    r = chat(srv, "inline", [{"role": "system", "content": "Alpha."}, {"role": "user", "content": "Beta"}])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode("Alpha.Beta", add_special_tokens=False))


def test_a_template_file_on_a_gguf_model_and_content_null(srv):
    """A template that concatenates content gets "" for an assistant turn that only called
    tools (OpenAI sends content: null there), as llama.cpp renders it."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    r = chat(srv, "gguf-file-template", messages)
    assert r.status_code == 200, r.text
    plain = chat(srv, "gguf-file-template", [{"role": "user", "content": "Weather in Paris?"}])
    assert r.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


def test_a_chat_template_that_is_neither_file_nor_jinja_stops_the_start(tmp_path, model_cache):
    with pytest.raises(RuntimeError, match="chat_template is neither"):
        Server(
            tmp_path,
            model_cache,
            '[[models]]\nid = "x"\nsource = "demo:tiny"\nchat_template = "nope.jinja"\n',
            startup_s=60,
        )


@pytest.mark.parametrize("model", ["ids", "gguf-ids"])
def test_tool_results_reach_the_template_paired_with_their_calls(srv, model):
    """Results sent out of order are rendered in their calls' order, each with the id of the call
    it answers (before: in the order sent, and tool_call_id never reached the template)."""
    calls = [
        {"id": f"call_{c}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}
        for c in ("a", "b")
    ]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_b", "content": "B"},
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
    ]
    tokens = httpx.post(
        srv.url + "/tokenize", json={"model": model, "messages": messages, "add_generation_prompt": False}, timeout=60
    ).json()["tokens"]
    text = httpx.post(srv.url + "/detokenize", json={"model": model, "tokens": tokens}, timeout=60).json()["prompt"]
    assert text.endswith("user:=Weather?;assistant:[call_a][call_b]=;tool:call_a=A;tool:call_b=B;"), text
