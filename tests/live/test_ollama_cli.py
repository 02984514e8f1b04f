"""The `ollama` CLI, command by command (issue 29): through tests/ollama_cli.py — an emulator built
from the CLI's source that sends exactly its requests and prints what it would print — against a
live server serving a transformers model and a GGUF model (the demo models; SmolLM2 where the
answer must be a JSON document), with a Hugging Face Hub on loopback for `pull`; `create` from a
local GGUF file uploads SmolLM2's real file."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2_GGUF, Server
from fake_hub import PUBLIC
from ollama_cli import Result, human_bytes, ollama

TRANSFORMERS, GGUF = "greenroom-demo", "greenroom-demo-gguf:Q8_0"
MODELS = (TRANSFORMERS, GGUF)
SMOL = "smollm2-135m-instruct:Q4_1"  # real weights, where the answer must be a JSON document
CONFIG = f"""
[[models]]
id = "{TRANSFORMERS}"
source = "demo:tiny"

[[models]]
id = "{GGUF}"
source = "demo-gguf:Q8_0"
engine = "llama.cpp"

[[models]]
id = "{SMOL}"
source = "{SMOLLM2_GGUF}"
engine = "llama.cpp"
preload = false
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub, cache):
    tmp = tmp_path_factory.mktemp("cli-server")
    srv = Server(tmp, cache, CONFIG, extra_env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home")})
    yield srv
    srv.stop()


def cli(server, *argv, **kw) -> Result:
    result = ollama(server.url, *argv, **kw)
    assert "panic" not in result.stderr, result.stderr
    return result


def ok(result: Result) -> Result:
    assert result.code == 0, result.stderr
    return result


def labelled(text: str) -> dict[str, str]:
    """The `label  value` rows of `ollama show`'s tables."""
    rows = (re.split(r" {2,}", line.strip()) for line in text.splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 2}


def sent(result: Result, path: str) -> list:
    return [s for s in result.sent if s.path == path]


def shown(server, model: str) -> dict:
    return httpx.post(server.url + "/api/show", json={"model": model}, timeout=60).json()


# --- show: the CLI fills only `name` ------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_show_names_the_model_by_name_and_prints_its_tables(server, model):
    r = ok(cli(server, "show", model))
    assert [(s.method, s.path) for s in r.sent] == [("HEAD", "/"), ("POST", "/api/show")]
    request = r.sent[1]
    assert request.body == b'{"model":"","system":"","template":"","verbose":false,"options":null,"name":"%s"}' % (
        model.encode()
    )
    assert request.headers["Accept"] == "application/json"
    assert re.fullmatch(r"ollama/\S+ \(\w+ \w+\) Go/go\S+", request.headers["User-Agent"])
    rows = labelled(r.stdout)
    expected = "Q8_0" if model == GGUF else "F32"
    assert (rows["architecture"], rows["parameters"], rows["quantization"]) == ("llama", "988K", expected)
    assert rows["context length"] == "32768" and rows["embedding length"] == "128"
    assert "  Capabilities\n" in r.stdout and re.search(r"^\s+completion\s*$", r.stdout, re.M)
    verbose = ok(cli(server, "show", model, "-v"))
    assert verbose.sent[1].json()["verbose"] is True
    metadata = labelled(verbose.stdout.split("  Metadata\n")[1])
    assert metadata["general.architecture"] == "llama" and metadata["llama.context_length"] == "32768"


@pytest.mark.parametrize("model", MODELS)
def test_show_flags_print_one_field_each(server, model):
    api = shown(server, model)
    modelfile = ok(cli(server, "show", model, "--modelfile")).stdout
    # a GGUF model is made from its file (the CLI uploads it), any other by name
    assert modelfile == api["modelfile"] + "\n" and ("\nFROM /" if model == GGUF else f"\nFROM {model}\n") in modelfile
    assert ok(cli(server, "show", model, "--parameters")).stdout == api["parameters"] + "\n"
    assert ok(cli(server, "show", model, "--template")).stdout == api["template"]  # printed as it is
    assert ok(cli(server, "show", model, "--system")).stdout == ""
    assert ok(cli(server, "show", model, "--license")).stdout == "\n"
    both = cli(server, "show", model, "--system", "--template")
    assert both.code == 1 and "only one of '--license', '--modelfile'" in both.stderr


def test_an_empty_system_template_or_options_is_not_reported(server):
    """The CLI sends all three on every show: empty, they ask for nothing (no header, no warning)."""
    before = server.log_path.read_text().count("request_fields_unused")
    r = ok(cli(server, "show", TRANSFORMERS))
    assert r.sent[1].json()["options"] is None
    body = {"model": "", "system": "", "template": "", "verbose": False, "options": {}, "name": TRANSFORMERS}
    quiet = httpx.post(server.url + "/api/show", content=json.dumps(body), timeout=60)
    assert quiet.status_code == 200 and "X-miLLM-Ignored-Fields" not in quiet.headers
    assert server.log_path.read_text().count("request_fields_unused") == before
    loud = httpx.post(server.url + "/api/show", json={**body, "system": "Be brief."}, timeout=60)
    assert loud.headers["X-miLLM-Ignored-Fields"] == '"system"'


# --- Ollama's rule: `model` when it is not empty, else `name` -------------------------------------------


def test_every_route_with_model_and_name_reads_name_when_model_is_empty(server):
    def post(path, body, method="POST"):
        return httpx.request(method, server.url + path, json=body, timeout=60)

    assert post("/api/show", {"model": "", "name": TRANSFORMERS}).status_code == 200
    assert post("/api/show", {"model": TRANSFORMERS, "name": "nosuch"}).status_code == 200  # model wins
    missing = post("/api/show", {"model": "", "name": ""})
    assert missing.status_code == 400 and missing.json()["code"] == "missing_parameter"
    made = post("/api/create", {"model": "", "name": "by-name", "from": TRANSFORMERS, "stream": False})
    assert made.status_code == 200, made.text
    assert post("/api/delete", {"model": "", "name": "by-name"}, "DELETE").status_code == 200
    gone = post("/api/delete", {"model": "", "name": "by-name"}, "DELETE")
    assert gone.status_code == 404 and gone.json()["code"] == "model_not_found"
    unknown = post("/api/pull", {"model": "", "name": "nosuch", "stream": False})
    assert unknown.status_code == 404 and unknown.json()["code"] == "model_not_found"


# --- run ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_run_answers_once(server, model):
    r = ok(cli(server, "run", model, "Hello", "there", "--verbose"))
    assert [(s.method, s.path) for s in r.sent] == [("HEAD", "/"), ("POST", "/api/show"), ("POST", "/api/generate")]
    assert r.sent[2].json() == {
        "model": model,
        "prompt": "Hello there",
        "suffix": "",
        "system": "",
        "template": "",
        "options": {},
    }
    assert r.sent[2].headers["Accept"] == "application/x-ndjson"
    assert r.stdout.endswith("\n\n") and r.stdout.strip()
    stats = dict(line.split(":", 1) for line in r.stderr.splitlines())
    assert {"total duration", "load duration", "prompt eval count", "eval count", "eval rate"} <= set(stats)
    assert re.fullmatch(r" +\d+ token\(s\)", stats["eval count"])


def test_run_reads_a_piped_prompt(server):
    r = ok(cli(server, "run", TRANSFORMERS, "Summarise:", stdin="Once upon a time"))
    assert sent(r, "/api/generate")[0].json()["prompt"] == "Once upon a time Summarise:"


def test_run_with_format_json_and_keepalive(server):
    ask = "Describe a cat as a JSON object with its name and age."
    typed = ("/set parameter temperature 0", ask, "/bye")
    r = ok(cli(server, "run", SMOL, "--format", "json", "--keepalive", "10m", tty=True, lines=typed))
    load, chat = sent(r, "/api/generate")[0].json(), sent(r, "/api/chat")[0].json()
    assert load == {
        "model": SMOL,
        "prompt": "",
        "suffix": "",
        "system": "",
        "template": "",
        "keep_alive": "10m0s",
        "options": None,
    }
    assert (chat["format"], chat["keep_alive"], chat["options"]) == ("json", "10m0s", {"temperature": 0})
    answer = r.stdout.split(f">>> {ask}\n")[1].split(">>> ")[0]
    assert set(json.loads(answer)) == {"name", "age"}
    row = next(row for row in ok(cli(server, "ps")).rows()[1:] if row[0] == SMOL)
    assert row[3] == "100% CPU" and int(row[4]) > 0 and row[5].endswith("minutes from now")
    ok(cli(server, "stop", SMOL))


def test_run_of_a_missing_model_pulls_it_first(server):
    r = cli(server, "run", "nosuch", "Hi")
    assert [(s.method, s.path) for s in r.sent] == [("HEAD", "/"), ("POST", "/api/show"), ("POST", "/api/pull")]
    assert sent(r, "/api/pull")[0].json() == {"model": "", "username": "", "password": "", "name": "nosuch"}
    assert r.code == 1 and r.stderr.startswith("Error: 404 Not Found: 'nosuch' is neither a known alias")


@pytest.mark.parametrize("model", MODELS)
def test_an_interactive_session_survives_set_think(server, model):
    typed = (
        "/show info",
        "/set think",
        "Hello",
        "/set nothink",
        "Hello again",
        "/set parameter num_predict 4",
        "/show parameters",
        "/show system",
        "/bye",
    )
    r = ok(cli(server, "run", model, tty=True, lines=typed))
    assert "  Model\n" in r.stderr and labelled(r.stderr)["architecture"] == "llama"  # /show info: stderr
    assert f'warning: model "{model}" does not support thinking output' in r.stderr
    assert f"Set 'think' mode.\n>>> Hello\nerror: 400 Bad Request: \"{model}\" does not support thinking" in r.stdout
    chats = [s.json() for s in sent(r, "/api/chat")]
    assert [c["think"] for c in chats] == [True, False]
    assert [m["content"] for m in chats[1]["messages"]] == ["Hello", "Hello again"]  # as the CLI keeps them
    answer = r.stdout.split(">>> Hello again\n")[1].split(">>> ")[0]
    assert answer.endswith("\n\n") and answer.strip()
    assert "User defined parameters:\n  num_predict" in r.stdout
    assert "No system message was specified for this model." in r.stdout
    shows = [s.json() for s in sent(r, "/api/show")]
    assert shows[-1] == {
        "model": "",
        "system": "",
        "template": "",
        "verbose": False,
        "options": {"num_predict": 4},
        "name": model,
    }


def test_think_is_refused_in_ollamas_words(server):
    def chat(think):
        body = {"model": TRANSFORMERS, "messages": [{"role": "user", "content": "Hi"}], "think": think}
        return httpx.post(server.url + "/api/chat", json=body, timeout=60)

    for think in (True, "high"):
        refused = chat(think)
        assert refused.status_code == 400 and refused.reason_phrase == "Bad Request"
        assert refused.json()["error"].startswith(f'"{TRANSFORMERS}" does not support thinking (request id: ')
    assert chat("banana").json()["error"].startswith('invalid think value: "banana"')
    assert chat(False).status_code == 200


# --- list, ps, stop -----------------------------------------------------------------------------------


def test_list_shows_each_models_size_and_time_from_its_files(server):
    tags = {m["name"]: m for m in httpx.get(server.url + "/api/tags", timeout=60).json()["models"]}
    r = ok(cli(server, "ls"))
    assert r.rows()[0] == ["NAME", "ID", "SIZE", "MODIFIED"]
    rows = {row[0]: row for row in r.rows()[1:]}
    for model in MODELS:
        name, digest, size, modified = rows[model]
        assert digest == tags[model]["digest"][:12] and size == human_bytes(tags[model]["size"]) != "0 B"
        assert modified.endswith("ago")
    assert [row[0] for row in ok(cli(server, "list", "greenroom-demo-g")).rows()[1:]] == [GGUF]  # a prefix


@pytest.mark.parametrize("model", MODELS)
def test_stop_unloads(server, model):
    ok(cli(server, "run", model, "Hi"))
    assert model in [row[0] for row in ok(cli(server, "ps")).rows()]
    r = ok(cli(server, "stop", model))
    assert sent(r, "/api/generate")[0].json()["keep_alive"] == "0s"
    assert model not in [row[0] for row in ok(cli(server, "ps")).rows()]
    missing = cli(server, "stop", "nosuch")
    assert missing.code == 1 and missing.stderr == 'Error: couldn\'t find model "nosuch" to stop\n'


# --- cp, rm, pull, push ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_cp_then_rm(server, model):
    assert ok(cli(server, "cp", model, "my-demo")).stdout == f"copied '{model}' to 'my-demo'\n"
    assert ok(cli(server, "run", "my-demo", "Hi")).stdout.strip()
    r = ok(cli(server, "rm", "my-demo"))
    assert r.stdout == "deleted 'my-demo'\n" and r.stderr == ""
    assert sent(r, "/api/delete")[0].body == b'{"model":"","name":"my-demo"}'
    assert "my-demo" not in [row[0] for row in ok(cli(server, "list")).rows()]
    configured = cli(server, "rm", model)
    assert configured.code == 1 and "comes from the server's configuration" in configured.stderr
    unknown = cli(server, "rm", "nosuch")
    assert unknown.code == 1 and unknown.stderr.startswith("Error: model 'nosuch' not found")


def test_pull_then_rm(server):
    r = ok(cli(server, "pull", PUBLIC))
    assert r.sent[1].json() == {"model": "", "username": "", "password": "", "name": PUBLIC}
    assert r.progress[0] == "pulling manifest" and r.progress[-1] == "success"
    assert PUBLIC in [row[0] for row in ok(cli(server, "list")).rows()]
    assert ok(cli(server, "rm", PUBLIC)).stdout == f"deleted '{PUBLIC}'\n"


def test_push_is_refused_with_why(server):
    r = cli(server, "push", TRANSFORMERS)  # a name on ollama.com: the CLI asks who is signed in first
    assert [(s.method, s.path) for s in r.sent] == [("HEAD", "/"), ("POST", "/api/me")]
    assert r.code == 1 and r.stderr.startswith("Error: push and sign-in are not supported: greenroom has no")
    elsewhere = cli(server, "push", "localhost:5000/me/demo")
    assert sent(elsewhere, "/api/push")[0].json() == {
        "model": "",
        "username": "",
        "password": "",
        "name": "localhost:5000/me/demo",
    }
    assert elsewhere.code == 1
    assert elsewhere.stderr.startswith("Error: 400 Bad Request: push is not supported: greenroom has no registry")


def test_status_lines_carry_their_reason_phrase(server):
    assert httpx.get(server.url + "/api/tags", timeout=60).reason_phrase == "OK"
    assert httpx.post(server.url + "/api/show", json={}, timeout=60).reason_phrase == "Bad Request"
    assert httpx.get(server.url + "/api/nothing", timeout=60).reason_phrase == "Not Found"


# --- create -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_create_from_an_existing_model(server, tmp_path, model):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {model}\nSYSTEM You are terse.\nPARAMETER temperature 0\nPARAMETER num_predict 8\n")
    r = ok(cli(server, "create", "terse", "-f", str(modelfile)))
    assert (
        sent(r, "/api/create")[0].body
        == (
            b'{"model":"terse","from":"%s","system":"You are terse.",'
            b'"parameters":{"num_predict":8,"temperature":0},"name":""}'
        )
        % model.encode()
    )
    assert r.progress[-1] == "success"
    answer = ok(cli(server, "run", "terse", "Hi", "--verbose"))
    assert re.search(r"^eval count: +[1-8] token\(s\)$", answer.stderr, re.M)  # its num_predict
    ok(cli(server, "rm", "terse"))


@pytest.mark.parametrize("model", MODELS)
def test_show_modelfile_then_create_round_trips(server, tmp_path, model):
    """`ollama show --modelfile X > M; ollama create Y -f M`: Y is X again (a GGUF model's file
    uploaded, any other made from by name), its own template taken back, and it answers."""
    (tmp_path / "Modelfile").write_text(ok(cli(server, "show", model, "--modelfile")).stdout)
    made = ok(cli(server, "create", "again", "-f", str(tmp_path / "Modelfile")))
    assert made.progress[-1] == "success"
    shown_again, original = shown(server, "again"), shown(server, model)
    assert shown_again["template"] == original["template"] and shown_again["parameters"] == original["parameters"]
    assert ok(cli(server, "run", "again", "Hi")).stdout.strip()
    ok(cli(server, "rm", "again"))


def test_create_from_a_local_gguf_file_then_run(server, tmp_path, cache):
    """Bringing one's own GGUF file: SmolLM2's, from its installed package. The CLI uploads it
    (verified as it streams), creates from its digest, and `run` answers; created again by an
    older CLI (HEAD first), the blob is found and stored once."""
    from greenroom.engines.demo.demo_model import default_cache_dir
    from greenroom.engines.loader import source_path

    gguf = Path(source_path(SMOLLM2_GGUF, None))
    (tmp_path / gguf.name).symlink_to(gguf)
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM ./{gguf.name}\nPARAMETER temperature 0\nPARAMETER num_predict 16\n")
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    made = ok(cli(server, "create", "mine", "-f", str(modelfile)))
    assert [(s.method, s.path) for s in made.sent] == [
        ("HEAD", "/"),
        ("POST", f"/api/blobs/{digest}"),
        ("POST", "/api/create"),
    ]
    assert sent(made, "/api/create")[0].json()["files"] == {gguf.name: digest} and made.progress[-1] == "success"
    answer = ok(cli(server, "run", "mine", "What is the capital of France?"))
    assert "Paris" in answer.stdout
    again = ok(cli(server, "create", "mine-too", "-f", str(modelfile), older=True))
    assert [(s.method, s.path) for s in again.sent] == [
        ("HEAD", "/"),
        ("HEAD", f"/api/blobs/{digest}"),  # stored: not uploaded again
        ("POST", "/api/create"),
    ]
    stored = [f.name for f in (default_cache_dir(cache) / "blobs").iterdir()]
    assert stored == [digest.replace(":", "-")]
    ok(cli(server, "rm", "mine"))
    ok(cli(server, "rm", "mine-too"))
    assert not any((default_cache_dir(cache) / "blobs").iterdir())  # gone with its last model


def test_a_modelfile_from_a_local_file_names_it_by_digest(tmp_path):
    """`FROM ./file.gguf` (no server): the CLI hashes the file and sends its digest in `files`
    after uploading it (`_CLI.create_blob`), with the Modelfile's other commands."""
    from ollama_cli import create_request, parse_modelfile

    (tmp_path / "model.gguf").write_bytes(b"GGUF" + bytes(60))
    modelfile = 'FROM ./model.gguf\nPARAMETER stop "<|im_end|>"\nPARAMETER stop "###"\nMESSAGE user Hi\nLICENSE MIT\n'
    notes: list[str] = []
    req = create_request(parse_modelfile(modelfile), tmp_path, notes)
    digest = "sha256:" + hashlib.sha256(b"GGUF" + bytes(60)).hexdigest()
    assert req.files == {str(tmp_path / "model.gguf"): digest} and req.from_ == "" and notes == []
    req.model, req.files = "mine", {"model.gguf": digest}  # as the CLI sends it: the base name
    assert req.body() == {
        "model": "mine",
        "files": {"model.gguf": digest},
        "license": ["MIT"],
        "parameters": {"stop": ["<|im_end|>", "###"]},
        "messages": [{"role": "user", "content": "Hi"}],
        "name": "",
    }


# --- metadata of models not built yet (no server) ----------------------------------------------------------


def test_a_demo_model_not_built_yet_is_listed_from_what_it_is_made_from(tmp_path, model_cache):
    """A demo checkpoint not built: its definition (was: 0 B, modified Never); a demo GGUF or
    OpenVINO model not built: the demo checkpoint it is made from, once that is built."""
    from greenroom.engines.demo import demo_model
    from greenroom.http.ollama import model_facts
    from greenroom.supervisor.placements import Placement

    def listed(source: str, engine: str, cache) -> dict:
        placed = model_facts.Placed("m", Placement("m", source, engine, "cpu", cache_dir=str(cache)), None)
        return model_facts.tags([placed])[0]

    empty = tmp_path / "empty"
    for source, engine in (
        ("demo:tiny", "transformers"),
        ("demo-gguf:Q4_0", "llama.cpp"),
        ("demo-openvino:tiny", "openvino"),
    ):
        row = listed(source, engine, empty)
        assert row["size"] == 988_288 * 4 and row["modified_at"] != "0001-01-01T00:00:00Z", source
        assert row["details"]["parameter_size"] == "988K" and row["details"]["quantization_level"] == "F32"
    assert listed("demo:1b", "transformers", empty)["size"] == demo_model.parameter_count("1b") * 2  # bfloat16

    checkpoint = demo_model.demo_model_dir(demo_model.default_cache_dir(model_cache))
    only_checkpoint = tmp_path / "only-checkpoint"
    (only_checkpoint / "models").mkdir(parents=True)
    (only_checkpoint / "models" / checkpoint.name).symlink_to(checkpoint, target_is_directory=True)
    files = [
        f for f in checkpoint.rglob("*") if f.is_file() and not f.relative_to(checkpoint).as_posix().startswith(".")
    ]
    row = listed("demo-gguf:Q4_0", "llama.cpp", only_checkpoint)
    assert row["size"] == sum(f.stat().st_size for f in files) and row["details"]["format"] == "safetensors"
