"""`ollama create` from a local GGUF file, as its CLI does it: the file uploaded to
`POST /api/blobs/sha256:<hex>` (older CLIs ask `HEAD` first), then `/api/create` with
`files: {name: digest}` — with the real `ollama` client where it has the calls (create_blob,
create, show) and raw httpx shaped like the Go CLI's requests (a chunked body labelled
application/json) where it does not. Blobs are verified while they stream to the cache and
stored once; the created model is served by llama.cpp, shown with its own values, and kept
across a restart. The module's server takes blobs up to 100 MiB (SmolLM2's file is 94)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gguf
import httpx
import numpy as np
import ollama
import psutil
import pytest
from conftest import MODEL, SMOLLM2_GGUF, Server

from greenroom.engines.demo.demo_gguf import demo_gguf_path
from greenroom.engines.demo.demo_model import default_cache_dir
from greenroom.engines.loader import source_path

LIMIT = 100 * 2**20
SMOL = "smollm2-135m-instruct:Q4_1"
CONFIG = f"""
[[models]]
id = "{MODEL}"
source = "demo:tiny"
preload = false

[[models]]
id = "{SMOL}"
source = "{SMOLLM2_GGUF}"
engine = "llama.cpp"
"""
GREEDY = {"temperature": 0, "num_predict": 8}
# what the Go client (api/client.go) sends with every request, the upload included
GO_HEADERS = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "ollama/0.12.0 (amd64)"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, cache):
    srv = Server(tmp_path_factory.mktemp("blobs"), cache, CONFIG, extra_env={"GREENROOM_MAX_BLOB_BYTES": str(LIMIT)})
    yield srv
    srv.stop()


@pytest.fixture
def oc(server):
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def store(cache):
    return default_cache_dir(cache) / "blobs"


@pytest.fixture(scope="module")
def demo_gguf(model_cache):
    return demo_gguf_path(default_cache_dir(model_cache), "Q8_0")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload(server, digest: str, data: bytes, chunk: int = 1 << 16) -> httpx.Response:
    """As the Go CLI uploads (cmd/cmd.go createBlob → api.Client.CreateBlob): the file as a
    stream of unknown length, so chunked, labelled application/json."""
    pieces = (data[i : i + chunk] for i in range(0, len(data), chunk))
    return httpx.post(f"{server.url}/api/blobs/{digest}", content=pieces, headers=GO_HEADERS, timeout=120)


def head(server, digest: str) -> int:
    return httpx.head(f"{server.url}/api/blobs/{digest}", headers=GO_HEADERS, timeout=30).status_code


def create(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/api/create", json={"stream": False, **body}, timeout=120)


def shown(server, model: str) -> dict:
    r = httpx.post(server.url + "/api/show", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def flat(r, status, code) -> str:
    assert r.status_code == status, r.text
    assert r.json()["code"] == code, r.json()
    return r.json()["error"]


def names(server) -> set[str]:
    return {m["name"] for m in httpx.get(server.url + "/api/tags", timeout=30).json()["models"]}


def stored(store) -> list[str]:
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def partials(store) -> list[str]:
    return [n for n in stored(store) if n.endswith("-partial")]


# --- pacing: an upload is never whole in memory ------------------------------------------------------


def test_an_uploads_body_is_paced_to_what_its_view_takes():
    """Quart's reader buffers every message it receives whatever its view has taken; DrainBody
    lets a streamed body's reader receive only while less than PACE_BYTES is untaken. A client
    as fast as loopback and a view that takes its time: what was received and not yet taken
    stays within PACE_BYTES and one message (unpaced, it is the whole body)."""
    import trio
    from quart import request
    from quart_trio import QuartTrio

    from greenroom.http.core.connection import PACE_BYTES, DrainBody, Paced

    app, taken, message, total = QuartTrio("paced"), [0], b"\0" * 2**16, 48 * 2**20
    sent, peak, statuses = [0], [0], []

    @app.route("/up", methods=["POST"])
    async def up():
        async for chunk in Paced(request.scope, request.body):
            taken[0] += len(chunk)
            await trio.sleep(0.002)  # a disk slower than the client
        return "", 201

    async def receive():
        peak[0] = max(peak[0], sent[0] - taken[0])
        if sent[0] >= total:
            if sent[0] == total:
                sent[0] += 1
                return {"type": "http.request", "body": b"", "more_body": False}
            await trio.sleep_forever()  # the client waits for the answer
        sent[0] += len(message)
        return {"type": "http.request", "body": message, "more_body": True}

    async def send(event):
        if event["type"] == "http.response.start":
            statuses.append(event["status"])

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/up",
        "raw_path": b"/up",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"x"), (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "extensions": {},
    }
    trio.run(DrainBody(app, lambda method, path: path == "/up"), scope, receive, send)
    assert statuses == [201] and taken[0] == total
    assert peak[0] <= PACE_BYTES + len(message), peak[0]


# --- the blob routes ----------------------------------------------------------------------------------


def test_a_blob_is_verified_while_it_streams_and_stored_once(server, store, demo_gguf):
    data = demo_gguf.read_bytes()
    digest = digest_of(data)
    assert head(server, digest) == 404  # older CLIs ask first
    r = upload(server, digest, data)
    assert r.status_code == 201, r.text
    assert head(server, digest) == 200
    blob = store / f"sha256-{digest[7:]}"
    assert blob.read_bytes() == data and not partials(store)
    mtime = blob.stat().st_mtime_ns
    assert upload(server, digest, data).status_code == 200  # present: the body is not read again
    assert blob.stat().st_mtime_ns == mtime
    assert head(server, "sha256-" + digest[7:].upper()) == 200  # Ollama's other spelling
    # the Python client uploads with a Content-Length
    assert ollama.Client(host=server.url).create_blob(demo_gguf) == digest
    assert stored(store).count(blob.name) == 1


def test_a_wrong_digest_or_a_malformed_one_is_refused_and_nothing_is_kept(server, store):
    data = os.urandom(300_000)
    claimed = digest_of(b"something else")
    error = flat(upload(server, claimed, data), 400, "digest_mismatch")
    assert f'digest mismatch, expected "{claimed}", got "{digest_of(data)}"' in error
    assert head(server, claimed) == 404 and head(server, digest_of(data)) == 404
    assert not partials(store)
    for bad in ("sha256:xyz", "sha256:" + "0" * 63, "md5:" + "0" * 64, "sha256:" + "0" * 64 + "0"):
        assert "invalid digest format" in flat(upload(server, bad, b"x"), 400, "invalid_parameter")
        assert head(server, bad) == 400


def test_a_blob_past_the_limit_is_413(server, store):
    """By its Content-Length before a byte is read (the status comes back with the headers),
    or as a chunked body's bytes pass the limit."""
    digest = digest_of(b"")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode())
        answer = b"".join(iter(lambda: s.recv(65536), b"")).decode()  # up to the server's close
    assert answer.startswith("HTTP/1.1 413") and "connection: close" in answer.lower(), answer
    assert '"request_too_large"' in answer and "max_blob_bytes" in answer
    big = b"\0" * (1 << 20)
    pieces = [big] * (LIMIT // len(big)) + [b"\0"]  # one byte past the limit, the last piece
    r = httpx.post(f"{server.url}/api/blobs/{digest}", content=iter(pieces), headers=GO_HEADERS, timeout=120)
    assert "max_blob_bytes" in flat(r, 413, "request_too_large")
    assert not partials(store) and head(server, digest) == 404


def test_two_uploads_of_one_blob_at_once_store_it_once(server, store):
    data = os.urandom(12 * 2**20)
    digest = digest_of(data)
    answers = []
    threads = [
        threading.Thread(target=lambda: answers.append(upload(server, digest, data).status_code)) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) in ([201, 201], [200, 201]), answers
    assert (store / f"sha256-{digest[7:]}").read_bytes() == data and not partials(store)


def test_a_client_gone_mid_upload_leaves_nothing_behind(server, store):
    data = os.urandom(4 * 2**20)
    digest = digest_of(data)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        s.sendall(b"%x\r\n%s\r\n" % (len(data) // 2, data[: len(data) // 2]))
        deadline = time.monotonic() + 10
        while not partials(store) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert partials(store)  # it was being written
    deadline = time.monotonic() + 10
    while partials(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not partials(store) and head(server, digest) == 404
    assert upload(server, digest, data).status_code == 201  # and the next upload is whole


# --- create from an uploaded GGUF file, then run ---------------------------------------------------------


def test_create_from_smollm2s_file_then_chat(server, oc, store):
    """The acceptance: `ollama create` from a local GGUF file (SmolLM2's, from the installed
    package) then `ollama run` answers — what the configured model of the same file answers —
    the upload streamed (the server's memory stays far below the file's size), verified and
    stored once however many models are made from it."""
    path = source_path(SMOLLM2_GGUF, None)
    data = path.read_bytes()
    digest = digest_of(data)
    front = psutil.Process(server.proc.pid)
    before, peak, done = front.memory_info().rss, [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], front.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        assert upload(server, digest, data).status_code == 201
    finally:
        done.set()
        sampler.join()
    took = time.monotonic() - started
    print(
        f"uploaded {len(data) / 2**20:.0f} MiB in {took:.2f} s; the front end grew {(peak[0] - before) / 2**20:.1f} MiB"
    )
    assert peak[0] - before < 40 * 2**20  # never the whole body in memory

    history = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "A helpful assistant."}]
    frames = list(
        oc.create(
            model="my-smol",
            files={path.name: digest},
            system="Answer in one short sentence.",
            parameters=GREEDY,
            messages=history,
            license="Apache-2.0",
            stream=True,
        )
    )
    statuses = [f.status for f in frames]
    assert statuses[:2] == ["parsing GGUF", f"using existing layer {digest}"] and statuses[-1] == "success"
    assert "my-smol" in names(server)
    hi = [{"role": "user", "content": "Hello"}]
    made = oc.chat(model="my-smol", messages=hi)
    by_hand = oc.chat(
        model=SMOL,
        messages=[{"role": "system", "content": "Answer in one short sentence."}] + history + hi,
        options=GREEDY,
    )
    assert made.message.content and made.message.content == by_hand.message.content
    assert made.prompt_eval_count == by_hand.prompt_eval_count
    assert oc.generate(model="my-smol", prompt="The capital of France is").response

    same = shown(server, SMOL)
    show = shown(server, "my-smol")
    assert show["details"] == {**same["details"], "parent_model": path.name}
    assert show["model_info"] == same["model_info"] and show["template"] == same["template"]
    assert show["system"] == "Answer in one short sentence." and show["license"] == "Apache-2.0"
    assert show["messages"] == history
    assert f"\nFROM {store / ('sha256-' + digest[7:])}\n" in show["modelfile"]

    # a second model from the same file: the CLI's upload is answered "present", nothing is copied
    assert oc.create_blob(path) == digest
    assert create(server, {"model": "my-smol-2", "files": {"smol.gguf": digest}}).json() == {"status": "success"}
    assert stored(store).count(f"sha256-{digest[7:]}") == 1
    assert oc.delete("my-smol").status == "success"
    assert head(server, digest) == 200  # my-smol-2 still serves it
    oc.delete("my-smol-2")
    assert head(server, digest) == 404  # gone with the last model made from it
    assert not {"my-smol", "my-smol-2"} & names(server)


def _lora_adapter(path) -> bytes:
    """A GGUF file that says it is a LoRA adapter (general.type), as llama.cpp's converter writes one."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_type("adapter")
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_create_from_files_refusals(server, store, demo_gguf, tmp_path):
    not_gguf = os.urandom(1000)
    bogus = digest_of(not_gguf)
    assert upload(server, bogus, not_gguf).status_code == 201
    gguf = digest_of(demo_gguf.read_bytes())
    assert upload(server, gguf, demo_gguf.read_bytes()).status_code in (200, 201)
    missing = digest_of(b"never uploaded")
    adapter = _lora_adapter(tmp_path / "lora.gguf")
    lora = digest_of(adapter)
    assert upload(server, lora, adapter).status_code == 201
    cases = [
        ({"files": {"x.bin": bogus}}, "invalid_blob", "supplied file was not in GGUF format"),
        ({"files": {"x.gguf": missing}}, "blob_not_found", f"blob not found for x.gguf (digest {missing})"),
        ({"files": {"l.gguf": lora}}, "invalid_blob", "LoRA adapters are not supported: l.gguf is one"),
        ({"files": {}}, "invalid_parameter", "no files provided to convert"),
        ({"files": {"a.gguf": gguf, "b.gguf": gguf}}, "invalid_parameter", "one GGUF file"),
        ({"files": {"../a.gguf": gguf}}, "invalid_parameter", "file path must be relative: ../a.gguf"),
        ({"files": {"/a.gguf": gguf}}, "invalid_parameter", "file path must be relative"),
        ({"files": {"a.gguf": "sha256:00"}}, "invalid_parameter", "invalid digest for a.gguf: invalid digest format"),
        ({"files": ["a.gguf"]}, "invalid_parameter", "'files' must be an object"),
        ({"files": {"a.gguf": gguf}, "from": MODEL}, "invalid_parameter", "not both"),
        (
            {"files": {"a.gguf": gguf}, "license": 3},
            "invalid_parameter",
            "'license' must be a string or an array of strings",
        ),
    ]
    for body, code, words in cases:
        assert words in flat(create(server, {"model": "refused", **body}), 400, code), body
    flat(
        create(server, {"model": "refused", "files": {"a.gguf": gguf}, "adapters": {"l.gguf": gguf}}),
        400,
        "field_not_honoured",
    )
    flat(create(server, {"model": "refused"}), 400, "missing_parameter")  # neither from nor files
    flat(create(server, {"model": MODEL, "files": {"a.gguf": gguf}}), 409, "model_exists")
    assert "refused" not in names(server)


def test_a_create_racing_the_delete_of_the_blobs_last_user_keeps_it_or_is_refused(server, demo_gguf):
    """Deleting the last model made from a blob removes the blob; a create from it at the same
    moment either comes first (the blob kept for it) or after (400 blob_not_found): never a
    model whose file is gone."""
    data = demo_gguf.read_bytes()
    digest = digest_of(data)
    for i in range(6):
        assert upload(server, digest, data).status_code in (200, 201)
        assert create(server, {"model": "race-a", "files": {"t.gguf": digest}}).status_code == 200
        with ThreadPoolExecutor(2) as pool:
            deleting = pool.submit(
                httpx.request, "DELETE", server.url + "/api/delete", json={"model": "race-a"}, timeout=60
            )
            made = pool.submit(create, server, {"model": "race-b", "files": {"t.gguf": digest}}).result()
            deleted = deleting.result()
        assert deleted.status_code == 200, deleted.text
        if made.status_code == 200:
            assert head(server, digest) == 200, i  # race-b serves it
            httpx.request("DELETE", server.url + "/api/delete", json={"model": "race-b"}, timeout=60)
        else:
            assert made.json()["code"] == "blob_not_found", made.text
        assert head(server, digest) == 404 and not {"race-a", "race-b"} & names(server)


# --- what /api/show says of a created model, and the round trip of its modelfile -------------------------


def test_show_gives_a_created_models_own_values(server, oc):
    template = "{{ .System }} USER: {{ .Prompt }} ASSISTANT: {{ .Response }}"
    history = [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Ahoy!"}]
    oc.create(
        model="pirate",
        from_=MODEL,
        system="You are a pirate.\nSpeak like one.",
        template=template,
        parameters={"temperature": 0.2, "stop": ["</s>", "\n\n"], "num_keep": 8},
        messages=history,
        license=["MIT", "Apache-2.0"],
    )
    show = shown(server, "pirate")
    base = shown(server, MODEL)
    assert "system" not in base and "messages" not in base and "license" not in base
    assert base["details"]["parent_model"] == ""
    assert show["details"] == {**base["details"], "parent_model": MODEL}
    assert show["system"] == "You are a pirate.\nSpeak like one." and show["template"] == template
    assert show["messages"] == history and show["license"] == "MIT\nApache-2.0"
    lines = show["parameters"].splitlines()
    assert f"{'temperature':<30} 0.2" in lines and f"{'num_keep':<30} 8" in lines
    assert f"{'stop':<30} " + json.dumps("</s>") in lines and f"{'stop':<30} " + json.dumps("\n\n") in lines
    assert f"{'num_ctx':<30} 2048" in lines  # the surface's defaults, under the model's own
    modelfile = show["modelfile"]
    assert "# FROM pirate\n\nFROM pirate\n" in modelfile  # a checkpoint is made from by name
    assert f'TEMPLATE """{template}"""\n' in modelfile
    assert 'SYSTEM "You are a pirate.\nSpeak like one."\n' in modelfile  # Ollama's quoting
    assert "PARAMETER temperature 0.2\nPARAMETER top_k 40\n" in modelfile
    assert 'PARAMETER stop </s>\nPARAMETER stop "\n\n"\n' in modelfile
    assert "LICENSE MIT\nLICENSE Apache-2.0\nMESSAGE user Ahoy?\nMESSAGE assistant Ahoy!\n" in modelfile
    sdk = oc.show("pirate")
    assert sdk.details.parent_model == MODEL and sdk.license == "MIT\nApache-2.0" and sdk.template == template
    # a model made from it shows it as its parent, and inherits what it does not replace
    oc.create(model="pirate-jr", from_="pirate", system="You are a young pirate.")
    jr = shown(server, "pirate-jr")
    assert jr["details"]["parent_model"] == "pirate" and jr["system"] == "You are a young pirate."
    assert jr["messages"] == history and jr["template"] == template and jr["license"] == show["license"]
    oc.delete("pirate-jr")
    oc.delete("pirate")


def test_a_gguf_models_modelfile_creates_it_again(server, oc, store, demo_gguf):
    """`ollama show --modelfile X > M; ollama create Y -f M`: FROM names the model's file, which
    the CLI uploads (present: answered at once) and names in `files`; the TEMPLATE it prints is
    the file's own chat template, taken back as the model's own; the rest as the CLI parses it.
    A CLI on another machine cannot read the file and sends the path as `from`: served too."""
    data = demo_gguf.read_bytes()
    digest = digest_of(data)
    assert upload(server, digest, data).status_code in (200, 201)
    assert (
        create(server, {"model": "tiny-made", "files": {demo_gguf.name: digest}, "system": "Be brief."}).status_code
        == 200
    )
    first = shown(server, "tiny-made")
    blob = store / f"sha256-{digest[7:]}"
    assert f"\nFROM {blob}\n" in first["modelfile"] and f'TEMPLATE """{first["template"]}"""' in first["modelfile"]
    assert "SYSTEM Be brief.\n" in first["modelfile"]
    # what the CLI sends for that Modelfile: the FROM file's digest, its name, and the commands
    assert digest_of(blob.read_bytes()) == digest and upload(server, digest, data).status_code == 200
    again = {"template": first["template"], "system": first["system"], "parameters": {"temperature": 0.8}}
    for name, source in (("tiny-remote", {"from": str(blob)}), ("tiny-again", {"files": {blob.name: digest}})):
        r = create(server, {"model": name, **source, **again})
        assert r.status_code == 200, r.text
        made = shown(server, name)
        assert made["template"] == first["template"] and made["system"] == "Be brief."
        assert made["model_info"] == first["model_info"]
    assert shown(server, "tiny-again")["details"]["parent_model"] == blob.name
    assert shown(server, "tiny-remote")["details"]["parent_model"] == "tiny-made"
    hi = [{"role": "user", "content": "Hi"}]
    assert (
        oc.chat(model="tiny-again", messages=hi, options=GREEDY).message.content
        == oc.chat(model="tiny-made", messages=hi, options=GREEDY).message.content
    )
    # a transformers model's modelfile names it, which `from` takes
    base = shown(server, MODEL)
    assert f"\nFROM {MODEL}\n" in base["modelfile"]
    assert create(server, {"model": "demo-again", "from": MODEL, "template": base["template"]}).status_code == 200
    assert shown(server, "demo-again")["template"] == base["template"]
    for name in ("tiny-made", "tiny-again", "tiny-remote", "demo-again"):
        oc.delete(name)
    assert not blob.exists()


# --- restart (last: it stops the module's server) ------------------------------------------------


def test_a_model_created_from_a_blob_survives_a_restart(server, cache, store, tmp_path, demo_gguf):
    data = demo_gguf.read_bytes()
    digest = digest_of(data)
    assert upload(server, digest, data).status_code in (200, 201)
    assert create(server, {"model": "kept-tiny", "files": {"t.gguf": digest}, "system": "Be brief."}).status_code == 200
    hi = [{"role": "user", "content": "Hi"}]
    before = ollama.Client(host=server.url, timeout=120).chat(model="kept-tiny", messages=hi, options=GREEDY)
    shown_before = shown(server, "kept-tiny")
    unused = b"uploaded, never created from"
    assert upload(server, digest_of(unused), unused).status_code == 201
    (store / "sha256-0123-left-by-a-kill-partial").write_bytes(b"half")
    server.stop()
    again = Server(tmp_path, cache, CONFIG, extra_env={"GREENROOM_MAX_BLOB_BYTES": str(LIMIT)})
    try:
        oc = ollama.Client(host=again.url, timeout=120)
        assert "kept-tiny" in names(again)
        # pruned at start-up, as Ollama prunes: what no model is made from
        left = {p.name for p in store.iterdir()}
        assert digest.replace(":", "-") in left and digest_of(unused).replace(":", "-") not in left
        assert not any(name.endswith("-partial") for name in left)
        assert shown(again, "kept-tiny") == shown_before
        assert oc.chat(model="kept-tiny", messages=hi, options=GREEDY).message.content == before.message.content
    finally:
        again.stop()
