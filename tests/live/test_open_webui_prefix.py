"""Open WebUI's conversation on the transformers engine: every message sends its built-in tools
(tests/data/open_webui_tools.json: ~13,700 tokens rendered by the demo tokenizer) and a system
message, then the conversation so far. The prefix tree (engines/transformers/prefix_cache.py)
keeps that head, so each message after the first prefills only what is new — with the same
greedy text as a server without reuse (prefix_cache_tokens = 0), on /v1 and on Ollama's /api/chat."""

import httpx
import ollama
import pytest
from conftest import Server

from greenroom.engines.transformers.prefix_cache import BLOCK

from .test_metrics import sample
from .test_open_webui import HELLO, SYSTEM, TOOLS, stream_v1

QUESTIONS = [HELLO["content"], "Which of your tools finds a web page?", "Thank you. And the time?"]
CONFIG = 'log_level = "warning"\n[[models]]\nid = "webui"\nsource = "demo:tiny"\nengine = "transformers"\n'


@pytest.fixture(scope="module")
def servers(tmp_path_factory, model_cache):
    """A server reusing prefixes (the default, sized from memory) and one that does not."""
    started = {}
    try:
        for name, extra in (("reuse", ""), ("none", "prefix_cache_tokens = 0\n")):
            started[name] = Server(tmp_path_factory.mktemp(name), model_cache, extra + CONFIG)
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def prefix_figures(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {name: sample(text, f"greenroom_prefix_cache_{name}", model="webui") for name in ("hits", "reused_tokens")}


def converse(server, ask, reusing: bool) -> list[tuple[str, int, dict]]:
    """Open WebUI's conversation through `ask(server, messages) → (answer, prompt tokens)`: each
    message with the answers before it; per message, the answer, its prompt's tokens and what the
    prefix tree reused for it (`reusing`: on the server with reuse)."""
    messages, out = [SYSTEM], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        before = prefix_figures(server) if reusing else {}
        answer, prompt_tokens = ask(server, messages)
        after = prefix_figures(server) if reusing else {}
        out.append((answer, prompt_tokens, {k: after[k] - before[k] for k in after}))
        messages.append({"role": "assistant", "content": answer})
    return out


def ask_v1(server, messages) -> tuple[str, int]:
    text, _, prompt_tokens = stream_v1(server.url, "webui", messages, TOOLS, 12)
    return text, prompt_tokens


def ask_ollama(server, messages) -> tuple[str, int]:
    client = ollama.Client(host=server.url, timeout=300)
    options = {"num_ctx": 16384, "num_predict": 12, "temperature": 0}
    parts = list(client.chat(model="webui", messages=messages, tools=TOOLS, stream=True, options=options))
    assert parts[-1].done and parts[-1].done_reason == "length"  # num_ctx held the whole prompt
    return "".join(p.message.content or "" for p in parts), parts[-1].prompt_eval_count


@pytest.mark.parametrize("ask", [ask_v1, ask_ollama], ids=["v1", "ollama"])
def test_each_message_after_the_first_reuses_the_tools_head_with_the_same_text(servers, ask):
    reused, plain = converse(servers["reuse"], ask, True), converse(servers["none"], ask, False)
    assert [text for text, _, _ in reused] == [text for text, _, _ in plain] and all(t for t, _, _ in plain)
    assert [n for _, n, _ in reused] == [n for _, n, _ in plain]
    assert reused[0][1] > 13_000  # the tools block, whole
    for (_, previous, _), (_, _, tree) in zip(reused, reused[1:]):
        # the message before it, but for the block its answer's first token may share
        assert tree["hits"] == 1 and tree["reused_tokens"] >= previous - 2 * BLOCK
