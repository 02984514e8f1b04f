"""Ollama's Go templates on a live server, through the real `ollama` client: a created model's
TEMPLATE renders /api/chat (tools too) and /api/generate as Ollama renders it, and so does
/api/generate's own `template`; the template /api/show prints is taken back by /api/create;
refusals name the construct. A rendered prompt is checked by generating from it raw: the same
greedy answer from the same number of prompt tokens."""

import httpx
import ollama
import pytest
from conftest import MODEL

GREEDY = {"temperature": 0, "num_predict": 6}
# {{ if }}, {{ with }}, {{ range $i, $m := }}, eq / ne, and the tools printed as Ollama prints them
TEMPLATE = """{{- if .System }}SYSTEM: {{ .System }}
{{ end }}
{{- with .Tools }}TOOLS: {{ . }}
{{ end }}
{{- range $i, $m := .Messages }}
{{- if ne $m.Role "system" }}{{ if eq $m.Role "user" }}USER{{ else }}BOT{{ end }} {{ $i }}: {{ $m.Content }}
{{ end }}
{{- end }}BOT:"""
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=60)


@pytest.fixture
def created(oc):
    """create(name, **fields): a model made from the demo model, deleted after the test."""
    names = []

    def create(name: str, **fields) -> str:
        assert oc.create(model=name, from_=MODEL, **fields).status == "success"
        names.append(name)
        return name

    yield create
    for name in names:
        oc.delete(name)


def same_as_raw(oc, answer, prompt: str) -> None:
    raw = oc.generate(model=MODEL, prompt=prompt, raw=True, options=GREEDY)
    content = answer.message.content if hasattr(answer, "message") else answer.response
    assert (content, answer.prompt_eval_count) == (raw.response, raw.prompt_eval_count)


def test_a_created_template_renders_the_chat(oc, created):
    created("tmpl-chat", template=TEMPLATE, system="Be brief.")
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    chat = oc.chat(model="tmpl-chat", messages=history, options=GREEDY)
    same_as_raw(oc, chat, "SYSTEM: Be brief.\nUSER 1: Hi\nBOT 2: Hello.\nUSER 3: Bye\nBOT:")
    # the model's own chat template would have rendered it otherwise
    assert chat.prompt_eval_count != oc.chat(model=MODEL, messages=history, options=GREEDY).prompt_eval_count
    with_tools = oc.chat(model="tmpl-chat", messages=history[:1], tools=[TOOL], options=GREEDY)
    tools = (
        '[{"type":"function","function":{"name":"get_weather","description":"The weather in a city",'
        '"parameters":{"type":"object","required":["city"],"properties":{"city":{"type":"string"}}}}}]'
    )
    same_as_raw(oc, with_tools, f"SYSTEM: Be brief.\nTOOLS: {tools}\nUSER 1: Hi\nBOT:")
    # on /api/generate: the system prompt, then the prompt as the user's message
    same_as_raw(oc, oc.generate(model="tmpl-chat", prompt="Hi", options=GREEDY), "SYSTEM: Be brief.\nUSER 1: Hi\nBOT:")


def test_generate_renders_its_own_template(oc):
    made = oc.generate(model=MODEL, prompt="Hi", system="Be brief.", template=TEMPLATE, options=GREEDY)
    same_as_raw(oc, made, "SYSTEM: Be brief.\nUSER 1: Hi\nBOT:")
    legacy = "{{ if .System }}[{{ .System }}] {{ end }}Q: {{ .Prompt }} A:"  # Ollama appends {{ .Response }}
    same_as_raw(oc, oc.generate(model=MODEL, prompt="Hi", template=legacy, options=GREEDY), "Q: Hi A:")


def test_the_template_show_prints_is_taken_back_by_create(oc, created):
    """`ollama show --modelfile X > M; ollama create Y -f M`: the model's own chat template
    (Jinja, not Go) is accepted, and the created model keeps rendering with it."""
    shown = oc.show(MODEL)
    assert shown.template and f'TEMPLATE """{shown.template}"""' in shown.modelfile
    created("tmpl-own", template=shown.template)
    hi = [{"role": "user", "content": "Hi"}]
    mine, base = (oc.chat(model=m, messages=hi, options=GREEDY) for m in ("tmpl-own", MODEL))
    assert (mine.message.content, mine.prompt_eval_count) == (base.message.content, base.prompt_eval_count)


@pytest.mark.parametrize(
    "template,code,words",
    [
        ('{{ template "header" . }}', "field_not_honoured", "{{template}} is not rendered"),
        ("{{ range .Messages }}{{ html .Content }}{{ end }}", "field_not_honoured", "the function 'html'"),
        ("{{ .Foo }}", "field_not_honoured", ".Foo is none of the values Ollama gives"),
        ("{{ if }}", "invalid_parameter", "missing command"),
        (
            "{{ range .Messages }}{{ .Foo }}{{ end }}",
            "invalid_parameter",
            "can't evaluate field Foo in type api.Message",
        ),
    ],
)
def test_create_refuses_a_template_by_its_construct(server, oc, template, code, words):
    r = httpx.post(server.url + "/api/create", json={"model": "bad", "from": MODEL, "template": template}, timeout=60)
    assert r.status_code == 400 and r.json()["code"] == code and words in r.json()["error"], r.text
    assert "bad" not in {m.model for m in oc.list().models}
    with pytest.raises(ollama.ResponseError) as exc:  # as the client sees it, on /api/generate too
        oc.generate(model=MODEL, prompt="Hi", template=template)
    assert exc.value.status_code == 400 and words in exc.value.error


def test_a_chat_the_template_fails_on_is_a_clean_400(oc, created):
    fails = '{{ range .Messages }}{{ if eq .Content "boom" }}{{ index .ToolCalls 0 }}{{ end }}{{ .Content }}{{ end }}'
    created("tmpl-fails", template=fails)
    with pytest.raises(ollama.ResponseError) as exc:
        oc.chat(model="tmpl-fails", messages=[{"role": "user", "content": "boom"}])
    assert exc.value.status_code == 400 and "index out of range: 0" in exc.value.error
    assert oc.chat(model="tmpl-fails", messages=[{"role": "user", "content": "calm"}], options=GREEDY).done


def test_a_chat_a_template_cannot_render_is_a_typed_400(server, oc, created):
    """Tools for a template that does not read .Tools (Ollama: the model does not support
    tools), and a call's arguments that are no JSON object, are refused by name, not dropped."""
    created("tmpl-no-tools", template="{{ range .Messages }}{{ .Content }}{{ end }}")
    hi = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ollama.ResponseError) as exc:
        oc.chat(model="tmpl-no-tools", messages=hi, tools=[TOOL])
    assert exc.value.status_code == 400 and "does not read .Tools" in exc.value.error
    created("tmpl-calls", template=TEMPLATE)
    for arguments, words in (("{bad", "is not JSON"), ("[1]", "must be an object")):
        call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]}
        body = {"model": "tmpl-calls", "messages": hi + [call] + hi, "stream": False}
        r = httpx.post(server.url + "/api/chat", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert f"'messages[1].tool_calls[0].function.arguments' {words}" in r.json()["error"]
