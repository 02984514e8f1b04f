"""Every example in README.md and docs/*.md runs against a live server.

The rules, for whoever writes an example:

- Every fenced ```python and ```sh block is an example and runs, in document order, unless the
  line right before its opening fence is a marker:
    <!-- not run: REASON -->       never run; REASON says why (it starts a server, pulls from the
                                  Hugging Face hub, runs a benchmark for minutes, ...)
    <!-- run: own server -->      run on a server of its own (default config, a cache of its own
                                  holding the session's demo models), for examples that change
                                  state that persists (steering, the registry of created models)
    <!-- run: own server, KEY=VALUE ... -->
                                  the same, started with those environment variables (an API key,
                                  CORS origins, continuous batching)
  Blocks with the same `run:` line share one server, in document order (a block may rely on what
  an earlier one made: a profile, a pulled file); unmarked blocks run on the session's `server`
  (the default config, `make serve`'s), and must leave it as they found it. Other fences (```toml,
  ```json, plain ```) are not examples.
- `http://127.0.0.1:8000` and `http://127.0.0.1:11434` become the test server's URL (test servers
  set GREENROOM_OLLAMA_PORT=0, so the Ollama API is on greenroom's own port).
- A python block runs as a script (`.venv`'s python); an sh block runs with `bash -e`, `.venv/bin`
  first on the PATH, in a directory of its own where `.venv` links to the checkout's (so
  `.venv/bin/greenroom ...` works and files it writes go away). Either must exit 0.
- Checked beyond the exit status:
  * every curl's HTTP status: 2xx, unless a comment on its command starts with the status it
    shows (`# 400 AMBIGUOUS_MODEL_NAME ...`, `# HTTP/1.1 204`, `# 403`);
  * a comment that is a response header, its name hyphenated (`# X-miLLM-Steering-Intensity: 0.5`),
    must be a line of the output (the name case-insensitive; a trailing `  (explanation)` is not
    part of it);
  * the outputs listed in OUTPUTS below, which are deterministic (temperature-0 answers of the
    real model on one machine; the shapes of JSON bodies). Comments describing sampled output
    of the random demo models (`# picks up after "walked"`) are not checked: no seed fixes them.

Also checked here, without a server: every relative link and anchor in README.md and docs/*.md
resolves, the README links every page of docs/, stays under 10 KB, and opens with `make serve`
and `make test`.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, Server

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_LANGS = ("python", "sh")
MARKER = re.compile(r"^<!--\s*(not run|run):\s*(.*?)\s*-->\s*$")
URLS = ("http://127.0.0.1:8000", "http://127.0.0.1:11434")


def normalised(stdout: str) -> bool:
    """The two allowed ids' probabilities sum to 1."""
    logprobs = [float(x) for x in re.findall(r"'token_id:\d+': (-?[\d.]+(?:e-?\d+)?)", stdout)]
    return len(logprobs) == 2 and abs(sum(math.exp(x) for x in logprobs) - 1) < 1e-4


# Deterministic outputs shown in comments: a unique part of the comment -> patterns the block's
# stdout must match (re.search, multiline), or a function of the stdout that must be true. Each
# entry must match some example's comment (test_outputs_are_current).
OUTPUTS = {
    # SmolLM2's temperature-0 answers (README, engines.md): transformers float32 on this machine
    "# The capital of France is Paris.": [r"The capital of France is Paris\."],
    '# {"capital": "Paris"}': [r'\{"capital": "Paris"\}'],
    "# tool_calls Function(arguments='{\"city\": \"Paris\"}', name='get_weather')": [
        re.escape("tool_calls Function(arguments='{\"city\": \"Paris\"}', name='get_weather')")
    ],
    # all-MiniLM-L6-v2's cosines (ollama.md): two sentences about music, and one about markets
    "# 0.67 -0.05": [r"^0\.67 -0\.05$"],
    # a batch of 128 on all-minilm: one 384-wide vector each
    "# 128 384": [r"^128 384$"],
    # /v1/embeddings' dimensions: the cut vector, at unit length
    "# 64 1.0": [r"^64 1\.0$"],
    # steering.md: SmolLM2 steered by its random SAE's feature 1 at a strength of 12 (bench/steering_units.py)
    '# … "content": "L\'Étoile, the capital of France."': [
        r"toile, the capital of France\.",
        r'"residual_norm":\s*17\d\.',
    ],
    # scoring with allowed_token_ids: the distribution is renormalised over the listed ids
    "# normalised over the two ids": [normalised],
    # /tokenize of the demo model: its BOS and four tokens, each token's own text
    '# {"count": 5, "max_model_len": 32768': [
        r'"count":\s*5\b',
        r'"max_model_len":\s*32768\b',
        r'"token_strs":\s*\["<\|begin_of_text\|>",\s*"Hell",\s*"o",\s*" the",\s*"re"\]',
        r'"tokens":\s*\[0,\s*848,\s*82,\s*269,\s*270\]',
    ],
    # the refusal of a bare GGUF repository name naming both quantizations
    "# 400 AMBIGUOUS_MODEL_NAME: Q8_0, Q4_0": [
        r'"code":\s*"AMBIGUOUS_MODEL_NAME"',
        r"greenroom-demo-gguf:Q8_0, greenroom-demo-gguf:Q4_0",
    ],
    # Needle's envelopes: the object names and keys (the values are the demo model's samples)
    '# {"object": "needle.extraction"': [r'"object":\s*"needle\.extraction"', r'"matched":', r'"data":'],
    '# {"object": "needle.completion"': [r'"object":\s*"needle\.completion"', r'"tool_calls":', r'"finish_reason":'],
    # the server's backend once batching is on; nothing batched yet on a server just started
    '# {"backend": "continuous_batching"': [
        r'^\{"actors":.*"backend":\s*"continuous_batching"',
        r'"name":\s*"cpu"',
        r'"batched":\s*0\b',
        r'"fixed_sampling":\s*\{',
    ],
    # per-request SAE activations: the SAE, layer and read point asked for
    '"millm": {"sae_activations": {"sae_id": "sae_demo_tiny_l1", "layer": 1, "read_point": "post_steering"': [
        r'"sae_activations":\s*\{',
        r'"sae_id":\s*"sae_demo_tiny_l1"',
        r'"layer":\s*1\b',
        r'"read_point":\s*"post_steering"',
        r'"positions":\s*\[\{',
    ],
    # a monitoring record of the chat completion just made
    '# {"records": [{"id": 1': [
        r'"records":\s*\[\{',
        r'"endpoint":\s*"/v1/chat/completions"',
        r'"sae_id":\s*"sae_demo_tiny_l1"',
        r'"next":\s*\d',
    ],
    # the steering lock: /v1/models lists the locked model alone
    "# only greenroom-demo, while locked": [r'^\{"data":\[\{[^\[\]]*"id":"greenroom-demo"[^\[\]]*\}\],'],
    # the engine-level readout: one entry per prompt position, each with its features
    "# [PositionRead(position, token_id, features=[FeatureValue(index, value), …]), …]": [
        r"\[PositionRead\(position=0, token_id=\d+, features=\[FeatureValue\(index=\d+, value="
    ],
}


@dataclass
class Block:
    page: str  # relative to the checkout
    line: int  # of the opening fence
    lang: str
    code: str
    marker: tuple[str, str] | None = None  # ("not run", reason) or ("run", spec)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def server_spec(self) -> tuple | None:
        """None: the session's server; else the sorted environment of a server of its own."""
        if self.marker is None:
            return None
        kind, spec = self.marker
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        assert kind == "run" and parts and parts[0] == "own server", f"{self.id}: unknown marker {self.marker}"
        env = dict(p.split("=", 1) for p in parts[1:])
        return tuple(sorted(env.items()))


def parse(path: Path) -> tuple[list[Block], list[int]]:
    """The page's fenced blocks (every language) and the lines of markers not right before one."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().split("\n")
    blocks, stray, i = [], [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if MARKER.match(lines[i]) and not (i + 1 < len(lines) and lines[i + 1].startswith("```")):
            stray.append(i + 1)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            m = MARKER.match(lines[i - 1]) if i else None
            blocks.append(
                Block(
                    page,
                    i + 1,
                    fence.group(1),
                    "\n".join(lines[i + 1 : end]) + "\n",
                    (m.group(1), m.group(2)) if m else None,
                )
            )
            i = end
        i += 1
    return blocks, stray


def examples() -> list[Block]:
    found = []
    for path in DOCS:
        for b in parse(path)[0]:
            if b.lang in EXAMPLE_LANGS and (b.marker is None or b.marker[0] == "run"):
                found.append(b)
    # the session server's blocks first, then each own server's in turn (one such server at a time)
    specs = list(dict.fromkeys(b.server_spec for b in found))
    return sorted(found, key=lambda b: specs.index(b.server_spec))


EXAMPLES = examples()


def comments(code: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"(?m)(?:^|\s)#\s?(.*)$", code)]


def curl_commands(code: str) -> list[str]:
    """The block's text cut at each line that starts a curl command (with its comments)."""
    lines = code.split("\n")
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("curl ")]
    return ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


def expected_status(command: str) -> int | None:
    """The status a comment on the command shows (`# 400 ...`, `# HTTP/1.1 204`), else None (2xx)."""
    for text in comments(command):
        m = re.match(r"(?:HTTP/[\d.]+\s+)?([1-5]\d\d)\b", text)
        if m:
            return int(m.group(1))
    return None


def header_comments(code: str) -> list[tuple[str, str]]:
    out = []
    for text in comments(code):
        m = re.match(r"([A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+):\s+(.*?)(?:\s{2,}\(.*\))?\s*$", text)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def substitute(code: str, url: str) -> str:
    for u in URLS:
        code = code.replace(u, url)
    assert "127.0.0.1:8000" not in code and ":11434" not in code, "a URL this test does not substitute"
    return code


CURL_WRAPPER = """curl() { command curl -w '%{stderr}\\n@@curl-status %{http_code}\\n' "$@"; }\n"""


def run_block(block: Block, url: str) -> subprocess.CompletedProcess:
    code = substitute(block.code, url)
    with tempfile.TemporaryDirectory(prefix="docs-example-") as cwd:
        (Path(cwd) / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)
        env = {
            **os.environ,
            "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
        }
        if block.lang == "python":
            (Path(cwd) / "example.py").write_text(code)
            cmd = [sys.executable, "example.py"]
        else:
            cmd = ["bash", "-e", "-c", CURL_WRAPPER + code]
        return subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


class Servers:
    """The session's server for unmarked blocks; one server of its own at a time for the rest
    (EXAMPLES runs each `run:` line's blocks together)."""

    def __init__(self, session, tmp_path_factory, model_cache):
        self.session, self.tmp, self.cache = session, tmp_path_factory, model_cache
        self.spec, self.own = None, None

    def get(self, spec):
        if spec is None:
            return self.session
        if spec != self.spec:
            self.close()
            from fake_hub import server_cache

            tmp = self.tmp.mktemp("docs-server")
            self.own, self.spec = Server(tmp, server_cache(tmp, self.cache), extra_env=dict(spec)), spec
        return self.own

    def close(self):
        if self.own is not None:
            self.own.stop()
            self.own = self.spec = None


def loaded(server) -> set[str]:
    return {
        m["id"] for m in httpx.get(server.url + "/api/models", timeout=30).json()["models"] if m["state"] == "loaded"
    }


@pytest.fixture(scope="module")
def servers(server, smollm2, tmp_path_factory, model_cache):
    """`smollm2` first: the real model's examples find it converted, as a warm `make serve` has it.
    The session's server is left as found: the models the examples loaded are unloaded after."""
    before = loaded(server)
    manager = Servers(server, tmp_path_factory, model_cache)
    yield manager
    manager.close()
    for model in loaded(server) - before:
        httpx.post(server.url + "/api/models/unload", json={"model": model}, timeout=120)


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.id for b in EXAMPLES])
def test_example_runs(block, servers):
    srv = servers.get(block.server_spec)
    done = run_block(block, srv.url)
    report = (
        f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
    assert done.returncode == 0, report
    stdout = done.stdout
    if block.lang == "sh":
        statuses = [int(s) for s in re.findall(r"^@@curl-status (\d+)$", done.stderr, re.MULTILINE)]
        commands = curl_commands(block.code)
        assert len(statuses) == len(commands), f"{len(commands)} curl commands, {len(statuses)} ran\n{report}"
        for command, status in zip(commands, statuses):
            want = expected_status(command)
            ok = status == want if want else 200 <= status < 300
            assert ok, f"{command.strip()[:200]!r} answered {status}, the page shows {want or '2xx'}\n{report}"
        for name, value in header_comments(block.code):
            assert re.search(rf"(?im)^{re.escape(name)}:\s*{re.escape(value)}\s*$", stdout), (
                f"header {name}: {value} not in the output\n{report}"
            )
    for text in comments(block.code):
        for key, patterns in OUTPUTS.items():
            if key in "# " + text or key in text:
                for pattern in patterns:
                    ok = pattern(stdout) if callable(pattern) else re.search(pattern, stdout, re.MULTILINE)
                    assert ok, (
                        f"{getattr(pattern, '__name__', pattern)!r} (shown as {key!r}) fails on the output\n{report}"
                    )


# --- without a server ------------------------------------------------------------------------


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in parse(path)[0]]


def test_markers_sit_before_an_example():
    for path in DOCS:
        blocks, stray = parse(path)
        assert not stray, f"{path.name}: markers not right before a fence at lines {stray}"
        for b in blocks:
            if b.marker:
                assert b.lang in EXAMPLE_LANGS, f"{b.id}: a marker on a ```{b.lang} block, which never runs"
                if b.marker[0] == "not run":
                    assert b.marker[1], f"{b.id}: `not run` needs a reason"
                else:
                    b.server_spec  # noqa: B018 (asserts the spec parses)


def test_outputs_are_current():
    shown = [c for b in EXAMPLES for c in comments(b.code)]
    for key in OUTPUTS:
        assert any(key in "# " + c or key in c for c in shown), f"{key!r} is shown by no example"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"(?m)^#{1,6} (.+)$", text):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def test_links_resolve():
    for path in DOCS:
        text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.name}: link to {target}: no such file"
            if anchor:
                assert anchor in anchors(dest), f"{path.name}: link to {target}: no such heading in {dest.name}"


def test_readme_is_short_and_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 10_000
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    first = next(b for b in parse(ROOT / "README.md")[0] if b.lang == "sh")
    assert first.code.startswith("make serve") and "\nmake test" in first.code  # .ci/run calls `make test`
