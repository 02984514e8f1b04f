"""Long shared prompt heads reused on the llama.cpp engine (issue 35): a prompt a sequence slot
drops is kept in host RAM (engines/llama_cpp/prompt_store.py) and copied back into a slot for a
later prompt that starts with it, which prefills only the rest — with the tokens and
log-probabilities of a full prefill, bit for bit, alone and beside other sequences. Served: Open
WebUI's request shape (its tools, a system message, a conversation whose second message carries
the first answer, with its title-generation request in between taking the one slot) through
/v1/chat/completions and Ollama's /api/chat gives the text a server without the store gives, and
the second message restores the head (/metrics); the default window (from memory) holds it.

Before: the in-between request's prefill cut the slot to its own prompt, and the second message
prefilled the whole head again (all 36 tools, ~13,700 tokens on the demo: ~17 s against ~2.5 s
for the restored head, one thread, on this 2-core machine); and on /v1 the fixed default window
(4096) refused it."""

from __future__ import annotations

import httpx
import ollama
import pytest
from conftest import SMOLLM2_GGUF, Server, first_steps

from greenroom.engines.base import SamplingParams
from greenroom.engines.generation import generate
from greenroom.engines.llama_cpp.llama_cpp_engine import LlamaCppBatch, LlamaCppEngine
from greenroom.engines.llama_cpp.prompt_store import PREFILL_GRID
from greenroom.engines.loader import source_path

from .test_metrics import sample
from .test_open_webui import HELLO, SYSTEM, stream_v1
from .test_open_webui import TOOLS as ALL_TOOLS

# a third of Open WebUI's tools (~4,800 tokens on the demo: past the old fixed window of 4096, and
# a third of the 36 tools' prefill time; test_open_webui.py sends them all)
TOOLS = ALL_TOOLS[:12]
MODEL = "greenroom-demo-gguf:Q8_0"
STORE = 1 << 30


def engine(path, ram: int, parallel: int = 1) -> LlamaCppEngine:
    return LlamaCppEngine("m", path, n_ctx=4096, threads=1, parallel=parallel, cache_ram=ram)


def prompts(e: LlamaCppEngine, tools: int) -> dict[str, list[int]]:
    """A long head (a tools block), a conversation on it, one that shares only part of the head,
    and a prompt sharing nothing."""
    head = e.tokenize(" ".join(f"Tool {i}: it does thing number {i} well." for i in range(tools)))
    ask = lambda text: e.tokenize(text, add_special_tokens=False)  # noqa: E731
    first = head + ask(" Question: what does tool 3 do? Tell me all about it, with many details please.")
    return {
        "first": first,
        "other": e.tokenize("Something else entirely, " * 40),
        "second": first + ask(" It sorts. And tool 9?"),
        "branch": head[: len(head) * 2 // 3] + ask(" Which tool sorts?"),
    }


@pytest.mark.parametrize("model,tools", [("demo-gguf:Q8_0", 80), (SMOLLM2_GGUF, 40)])
def test_restored_cells_give_the_tokens_of_a_prefill(model_cache, model, tools):
    """One slot: every prompt after the first takes the slot from the one before, so the second
    message and the branch restore their heads from RAM; each prompt's first steps (tokens,
    log-probabilities, top tokens) equal a fresh engine's without the store, bit for bit."""
    path = source_path(model, str(model_cache))
    reusing = engine(path, STORE)
    asked = prompts(reusing, tools)
    order = ["first", "other", "second", "other", "branch"]
    params = SamplingParams(temperature=0.0, logprobs=3)
    got = [first_steps(reusing, asked[name], params, 6) for name in order]
    stats = reusing.prefix_cache.stats()
    reusing.unload()
    assert stats["restored"] == 3 and stats["entries"] == 2, stats  # second, other again, branch
    head = len(asked["branch"]) // PREFILL_GRID * PREFILL_GRID
    assert stats["reused_tokens"] >= len(asked["first"]) // PREFILL_GRID * PREFILL_GRID + head, stats
    for name, steps in zip(order, got):
        plain = engine(path, 0)
        assert plain.prefix_cache is None
        assert first_steps(plain, asked[name], params, 6) == steps, name
        plain.unload()


def test_restored_beside_other_sequences(model_cache):
    """A prompt restored into a slot while another sequence decodes in the next one (one
    llama_decode for both where that measured faster): both texts are what each gives alone."""
    path = source_path("demo-gguf:Q8_0", str(model_cache))
    reusing = engine(path, STORE, parallel=2)
    asked = prompts(reusing, 80)
    longer = reusing.tokenize("A story about nothing in particular. " * 120)  # shares nothing, and holds more
    assert len(longer) > len(asked["first"])
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    first_steps(reusing, asked["first"], greedy, 1)  # slot 0
    first_steps(reusing, longer, greedy, 1)  # slot 1, the empty one
    first_steps(reusing, asked["other"], greedy, 1)  # the slot holding least: the first prompt's, kept in RAM
    batch = LlamaCppBatch(reusing)
    texts = {"longer": "", "second": ""}
    texts["longer"] += batch.join([("longer", longer, greedy)])[0].text
    for _ in range(3):
        for key, delta in batch.step():
            texts[key] += delta.text
    restored = reusing.prefix_cache.stats()["restored"]
    texts["second"] += batch.join([("second", asked["second"], greedy)])[0].text
    assert reusing.prefix_cache.stats()["restored"] == restored + 1
    while len(batch):
        for key, delta in batch.step():
            texts[key] += delta.text
    reusing.unload()
    for name, ids in (("longer", longer), ("second", asked["second"])):
        plain = engine(path, 0)
        alone = "".join(delta.text for delta in generate(plain, ids, greedy))
        plain.unload()
        assert texts[name] == alone and alone, name


# Open WebUI: the chat, then its title-generation task (no tools: it takes the one slot), then the
# second message carrying the first answer
FIRST = HELLO
SECOND = {"role": "user", "content": "Thanks. Which of those tools searches the web?"}


def title_task(answer: str) -> list[dict]:
    history = f"USER: {FIRST['content']}\nASSISTANT: {answer}"
    return [
        {
            "role": "user",
            "content": "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.\n"
            f"### Chat History:\n<chat_history>\n{history}\n</chat_history>",
        }
    ]


def config(ram_mib: int | None) -> str:
    """One sequence slot, so the title task takes the conversation's; no n_ctx: the default window."""
    ram = "" if ram_mib is None else f"gguf_cache_ram_mib = {ram_mib}\n"
    return f'gguf_parallel = 1\n{ram}[[models]]\nid = "{MODEL}"\nsource = "demo-gguf:Q8_0"\nengine = "llama.cpp"\n'


def openai_turn(url: str, messages: list[dict], tools: list | None) -> tuple[str, float, int]:
    """Open WebUI's streamed chat: the text, the seconds to its first token, the prompt's tokens."""
    return stream_v1(url, MODEL, messages, tools, 16)


def ollama_turn(url: str, messages: list[dict], tools: list | None) -> str:
    """The same on Ollama's surface, with a num_ctx that holds it (its default, 2048, would cut it)."""
    client = ollama.Client(host=url, timeout=300)
    options = {"num_ctx": 32768, "num_predict": 16, "temperature": 0}
    return "".join(p.message.content for p in client.chat(MODEL, messages, tools=tools, options=options, stream=True))


def conversation(url: str, turn) -> list:
    """The first message, the title task, the second message: the two messages' answers."""
    first = turn(url, [SYSTEM, FIRST], TOOLS)
    answer = first[0] if isinstance(first, tuple) else first
    turn(url, title_task(answer), None)
    second = turn(url, [SYSTEM, FIRST, {"role": "assistant", "content": answer}, SECOND], TOOLS)
    return [first, second]


@pytest.fixture(scope="module")
def plain(tmp_path_factory, model_cache):
    """A server without the RAM store: the reference texts."""
    srv = Server(tmp_path_factory.mktemp("gguf-store-off"), model_cache, config(0))
    yield srv
    srv.stop()


def test_open_webui_conversation_restores_its_head(tmp_path, model_cache, plain):
    srv = Server(tmp_path, model_cache, config(None))
    try:
        (first, ttft_first, prompt), (second, ttft_second, _) = conversation(srv.url, openai_turn)
        spoken = conversation(srv.url, ollama_turn)
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        window = next(m for m in httpx.get(srv.url + "/api/ps", timeout=30).json()["models"] if m["model"] == MODEL)
    finally:
        srv.stop()
    (ref_first, *_), (ref_second, *_) = conversation(plain.url, openai_turn)
    assert [first, second] == [ref_first, ref_second] and first and second
    assert spoken == conversation(plain.url, ollama_turn)  # Ollama's surface renders its tools its own way
    figure = lambda name: sample(metrics, f"greenroom_prefix_cache_{name}", actor=f"gguf:{MODEL}", model=MODEL)  # noqa: E731
    # each surface's second message restored its head (the first messages' prompts differ: each
    # surface renders the tools its own way)
    assert figure("restored") == 2 and figure("reused_tokens") >= 2 * (prompt - PREFILL_GRID), metrics
    # the demo's trained window, the memory default: it holds the prompt the old 4096 could not
    assert window["context_length"] == 32_768 and prompt > 4096
    print(f"time to first token: first message {ttft_first:.2f} s, second {ttft_second:.2f} s")
    assert ttft_second < 0.5 * ttft_first, (ttft_first, ttft_second)  # ~0.15 here (bench: ≤ 0.2)
