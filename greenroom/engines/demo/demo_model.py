"""A tiny, locally generated Llama checkpoint for demos, tests and benchmarks.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on the corpus
embedded below, and the weights are random but deterministic from a seed. The
result is an ordinary Hugging Face directory, so every engine loads it the same
way it loads a real model.

torch / transformers / tokenizers are imported inside the build functions so
that resolving a cached model (the common case) stays cheap for callers that
never load one themselves.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import unicodedata
from pathlib import Path

# Bump whenever the generated files would change; cached copies with another
# version are rebuilt by ensure_demo_model.
GENERATOR_VERSION = 3

DEMO_MODEL_NAME = "greenroom-demo"

# Keys other than "dtype" are LlamaConfig arguments. vocab_size is also the BPE
# target; the embedded corpus supports up to ~1.8k tokens. All sizes share the
# 1024-token vocabulary so a benchmark prompt is the same tokens at every size.
SIZES: dict[str, dict] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
        # a trained window that holds what real clients send: Open WebUI's default chat brings 36
        # tools, ~14k tokens of this vocabulary (RoPE needs nothing more for a longer window)
        max_position_embeddings=32768,
        dtype="float32",
    ),
    # Llama proportions (head_dim 64, GQA 3:1, MLP 8/3) at ~100M for CPU benchmarks.
    "100m": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=1024,
        max_position_embeddings=32768,
        dtype="float32",
    ),
    # Llama-3.2-1B body; the demo vocabulary replaces its 128k one.
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=1024,
        max_position_embeddings=8192,
        dtype="bfloat16",
    ),
}

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, IM_START, IM_END]
# Atomic tokens, but not special: as in Qwen/Hermes tokenizers they survive
# decode(skip_special_tokens=True), where tool-call parsers look for them.
TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]

# Target std of the output logits. Larger makes sampling nearly greedy (and so
# loopy); smaller makes sampled text uniform noise and lets the zero-logit end
# tokens come up often.
LOGIT_STD = 3.0
# Scaled by 1/rms of the final residual (0.75-1 at these sizes): logits near -90.
SUPPRESS_BIAS = 100.0

# ChatML turns with Hermes-style tool calling. The tool system block absorbs a
# leading system message; OpenAI-style calls ({"function": {...}}) and bare
# {"name", "arguments"} calls are both accepted, with arguments as a JSON string
# or an object.
CHAT_TEMPLATE = r"""
{{- bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' and messages[0].content %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' }}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if loop.first and message.role == 'system' and tools %}
        {#- already in the tools block #}
    {%- elif message.role in ('tool', 'function') %}
        {{- '<|im_start|>tool\n<tool_response>\n' + (message.content or '') + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {%- set args = call.arguments if call.arguments is string else (call.arguments | tojson) %}
            {{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' + args + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""".strip()

# Tokenizer training text: prose, dialogue, code, JSON and numbers, so that
# words, indentation, punctuation and digit runs all earn merges.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who "
    "talked to the gulls every morning before he pushed his boat into the grey water.",
    "She opened the window, and the smell of rain and cut grass filled the room. "
    "Somewhere down the street a dog was barking at the mail carrier, as it did every day.",
    "Machine learning models are trained on large amounts of text. A language model "
    "predicts the next token given the tokens that came before it, one step at a time.",
    "The server listens on port 8080 and answers requests over HTTP. Each request carries "
    "a model name, a list of messages, and optional settings such as temperature and top_p.",
    "Q: What is the capital of France?\nA: The capital of France is Paris.\n"
    "Q: How many legs does a spider have?\nA: A spider has eight legs.",
    "User: Can you help me write an email to my landlord about the broken heater?\n"
    "Assistant: Of course. Here is a short, polite draft you can adapt to your situation.",
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n\nprint([fibonacci(i) for i in range(10)])",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n"
    '    def pop(self):\n        if not self.items:\n            raise IndexError("pop from empty stack")\n'
    "        return self.items.pop()",
    "for (let i = 0; i < array.length; i++) {\n  if (array[i] === target) {\n    return i;\n  }\n}\nreturn -1;",
    '#include <stdio.h>\n\nint main(void) {\n    printf("Hello, world!\\n");\n    return 0;\n}',
    "$ git clone https://github.com/example/project.git && cd project\n"
    "$ python -m venv .venv && source .venv/bin/activate\n$ pip install -e '.[test]'",
    '{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}',
    '{"id": 42, "items": [1, 2, 3], "price": 19.99, "in_stock": true, "tags": ["new", "sale"], "owner": null}',
    "SELECT name, email FROM users WHERE created_at >= '2024-01-01' ORDER BY name LIMIT 100;",
    "The meeting is on 2025-03-14 at 09:30. Call +1 (555) 010-2368 or write to "
    "team@example.org before 5 p.m. on Friday.",
    "Invoice #10293: 3 x widgets at $4.50 each = $13.50; shipping $7.25; tax 8.875%; total $22.03. Paid on 12/31/2023.",
    "Pi is approximately 3.14159265358979, e is about 2.71828, and the square root of two "
    "is 1.41421356. One million is 1,000,000 and a googol is 10^100.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 64 75 99 100 128 "
    "256 512 1000 1024 2048 4096 8192 65536 1000000",
    "In 1969, astronauts landed on the Moon. In 1989 the Berlin Wall fell, and in 2007 the "
    "first smartphone with a multi-touch screen went on sale.",
    "Recipe: mix 200 g of flour, 2 eggs, 300 ml of milk and a pinch of salt. Rest the batter "
    "for 30 minutes, then cook thin pancakes in a hot, buttered pan.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune.",
    "Photosynthesis converts light energy into chemical energy. Plants take in carbon dioxide "
    "and water and release oxygen as a by-product.",
    "The mitochondria is the powerhouse of the cell; ribosomes build proteins, and the "
    "nucleus stores genetic information in long strands of DNA.",
    "Why did the programmer quit his job? Because he didn't get arrays! Ha-ha... okay, "
    "that's a terrible joke; I'm sorry.",
    "Error: connection refused (errno 111). Retrying in 2.5 seconds... [attempt 3/5] "
    "WARNING: falling back to localhost:11434.",
    'Traceback (most recent call last):\n  File "main.py", line 12, in <module>\n'
    "    result = divide(10, 0)\nZeroDivisionError: division by zero",
    "Dear Sam, thank you for your letter. I was glad to hear that your new job is going well "
    "and that the kids have settled into their school. Warm regards, Alex.",
    "The river winds through the valley, past orchards of apple and pear, under three old "
    "stone bridges, until it reaches the harbour where the ferries wait.",
    "Markdown supports **bold**, *italic*, `inline code`, [links](https://example.com), "
    "and lists:\n- first item\n- second item\n  - nested item",
    "| Name  | Age | City     |\n|-------|-----|----------|\n| Alice | 34  | Lisbon   |\n| Bob   | 27  | Montréal |",
    "Weather today: sunny, high of 24°C (75°F), low of 13°C. Winds from the north-west "
    "at 15 km/h; humidity 40%; UV index 6.",
    "A café on the corner sells croissants, crêpes and strong coffee; the naïve tourist pays €4.80 for an espresso.",
    "If x = 3 and y = 4, then x^2 + y^2 = 25, so the hypotenuse is 5. The area of a circle "
    "with radius r is pi * r * r.",
    "Step 1: read the instructions. Step 2: gather your tools. Step 3: measure twice, cut once. "
    "Step 4: clean up afterwards!",
    "import json\nimport os\n\nwith open(os.path.join(path, 'config.json')) as f:\n"
    "    config = json.load(f)\nprint(config.get('hidden_size', 768))",
    "curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' "
    '-d \'{"model": "demo", "messages": [{"role": "user", "content": "hi"}]}\'',
    "Children played in the park while their parents talked on the benches. An ice cream "
    "truck played its tinny song, and everyone suddenly wanted something cold.",
    "Good morning! How are you today? I'm fine, thanks. Would you like some tea or coffee? "
    "Tea, please, with a little milk and no sugar.",
    "The committee reviewed 17 proposals, approved 9, rejected 5 and asked for revisions on 3; "
    "the budget for next year rises by 4.2 percent.",
    "Mountains covered in snow rose above the forest. The hikers followed a narrow trail, "
    "crossed a wooden bridge, and camped beside a quiet, clear lake.",
    "Security note: never commit passwords or API keys to version control. Rotate secrets "
    "regularly and grant each service only the permissions it needs.",
    "const total = items.reduce((sum, item) => sum + item.price * item.quantity, 0);\n"
    "console.log(`Total: ${total.toFixed(2)}`);",
    "Libraries lend books, music and films for free. Many also offer quiet rooms for study, "
    "classes for adults, and story hours for young children on Saturday mornings.",
)


def default_cache_dir(root: str | Path | None = None) -> Path:
    """`<root>/models`, root being the argument, else `$GREENROOM_CACHE`, else
    `$XDG_CACHE_HOME/greenroom` (~/.cache by default)."""
    base = root or os.environ.get("GREENROOM_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        base = Path(xdg) / "greenroom"
    return Path(base) / "models"


def parameter_count(size: str) -> int:
    """The parameters the generator makes for `size` (a Llama without biases, its embeddings
    untied: _random_model) — known before the checkpoint is built."""
    s = SIZES[size]
    hidden, kv = s["hidden_size"], s["hidden_size"] // s["num_attention_heads"] * s["num_key_value_heads"]
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * s["intermediate_size"] + 2 * hidden
    return 2 * s["vocab_size"] * hidden + s["num_hidden_layers"] * layer + hidden


def demo_model_dir(cache_dir: Path, size: str = "tiny") -> Path:
    """Where the demo model of `size` lives (built or not)."""
    return Path(cache_dir) / f"greenroom-demo-{size}"


def ensure_demo_model(cache_dir: Path, size: str = "tiny") -> Path:
    """Return `cache_dir/greenroom-demo-{size}`, (re)building it if missing or stale."""
    cache_dir = Path(cache_dir)
    out_dir = demo_model_dir(cache_dir, size)
    if _is_current(out_dir, size):
        return out_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Serialise builders across processes; whoever waited finds the work done.
    with open(cache_dir / f".greenroom-demo-{size}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_current(out_dir, size):
            build_demo_model(out_dir, size)
    return out_dir


def build_demo_model(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a complete checkpoint to `out_dir`, replacing it atomically."""
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(SIZES)}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Same filesystem as out_dir so the final rename is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        _write_checkpoint(tmp, size, seed)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            os.chmod(f, 0o644)  # save_pretrained writes model.safetensors 0600
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.rename(out_dir, old / "stale")
            os.rename(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _is_current(out_dir: Path, size: str) -> bool:
    try:
        marker = json.loads((out_dir / "greenroom.json").read_text())
    except (OSError, ValueError):
        return False
    return marker == {"generator_version": GENERATOR_VERSION, "size": size, "seed": 0}


def _write_checkpoint(path: Path, size: str, seed: int) -> None:
    settings = SIZES[size]
    tokenizer = _train_tokenizer(settings["vocab_size"], settings["max_position_embeddings"])
    tokenizer.save_pretrained(path)
    model = _random_model(settings, tokenizer, seed)
    model.save_pretrained(path)
    (path / "greenroom.json").write_text(
        json.dumps({"generator_version": GENERATOR_VERSION, "size": size, "seed": seed}) + "\n"
    )


def _train_tokenizer(vocab_size: int, max_length: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_CALL_TAGS),
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text encodes without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_CALL_TAGS])
    if tok.get_vocab_size() != vocab_size:
        # Model shapes in SIZES assume the exact size; a smaller corpus would silently shrink them.
        raise RuntimeError(f"corpus yields {tok.get_vocab_size()} tokens, {vocab_size} wanted")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        add_bos_token=True,  # plain prompts start with BOS like the chat template does
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _random_model(settings: dict, tokenizer, seed: int):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, settings["dtype"])
    bos, eos, im_end = tokenizer.convert_tokens_to_ids([BOS, EOS, IM_END])
    config = LlamaConfig(
        **{k: v for k, v in settings.items() if k != "dtype"},
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
        dtype=dtype,
    )
    # Allocate without transformers' init pass (seconds of wasted work for 1b);
    # every parameter is filled below. Non-persistent buffers (rotary inv_freq) stay
    # uninitialised, which is fine: they are not saved and this model is never run.
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model.to_empty(device="cpu")

    # Unit-variance activations everywhere instead of the std-0.02 init, which
    # makes an untrained model emit one token forever. Branches writing to the
    # residual stream are scaled by 1/sqrt(2 * layers) (as in GPT-2) so its
    # variance stays bounded with depth; unscaled, the 100m and 1b sizes fall
    # into greedy loops like "forforfor" within a few tokens.
    gen = torch.Generator().manual_seed(seed)
    hidden = settings["hidden_size"]
    residual_scale = (2 * settings["num_hidden_layers"]) ** -0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "model.embed_tokens.weight":
                p.normal_(0.0, 1.0, generator=gen)
            elif name == "lm_head.weight":
                # Final hidden states have RMS 1, so this gives logits of std LOGIT_STD.
                p.normal_(0.0, LOGIT_STD / hidden**0.5, generator=gen)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, residual_scale * p.shape[1] ** -0.5, generator=gen)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=gen)
        # Residual channel 0 is held at 1: set in every embedding and never
        # written by a layer. After the final RMSNorm it is 1/rms > 0, so
        # lm_head column 0 acts as a per-token bias.
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        # Tokens that are not text on their own (markup specials, lone UTF-8
        # pieces, control bytes) get a large negative bias, so generated text
        # is always clean. EOS and <|im_end|> get logit 0: far below the top
        # of a std-LOGIT_STD distribution, so greedy text does not end and
        # sampled text only rarely does (~4e-5 per token at temperature 1).
        suppressed = _unwanted_ids(tokenizer)
        model.lm_head.weight[suppressed] = 0.0
        model.lm_head.weight[suppressed, 0] = -SUPPRESS_BIAS
        model.lm_head.weight[[eos, im_end]] = 0.0

    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=[im_end, eos], pad_token_id=eos)
    return model


def _unwanted_ids(tokenizer) -> list[int]:
    """Ids a demo model should never emit: markup other than the end tokens, and
    tokens that are not valid, printable text on their own."""
    ids = set(tokenizer.convert_tokens_to_ids([BOS, IM_START, *TOOL_CALL_TAGS]))
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if "\ufffd" in text or any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in text):
            ids.add(i)
    return sorted(ids)
