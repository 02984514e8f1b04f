"""The steering console (/ui/, docs/console.md) in a real browser: Playwright (PyPI) driving
Debian's chromium (`make test` installs it where it is missing; never skipped), against one
server running SmolLM2 on transformers with its random SAE, behind an API key. One browser; the
tests share one page at 1280×800, in order (tree → chat → features → steering → monitoring),
and one more at 390×844. Each checks the DOM, saves a screenshot in the artifacts folder it
prints, and fails on any console error or uncaught exception in the page."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, SMOLLM2_GGUF, Server

CHROMIUM = Path("/usr/bin/chromium")
KEY = "console-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "smollm2-135m-instruct"
SAE = "sae_random_d576_l15"
CONFIG = f"""
api_key = "{KEY}"
[[models]]
id = "{MODEL}"
source = "gguf-converted:{SMOLLM2_GGUF}"
engine = "transformers"
sae = "random:576:15"
"""
DOCUMENTS = (
    ("/api/profiles", {"name": "loud", "model": MODEL, "strengths": {SAE: {"5": 150}}}),
    (
        "/api/clusters/import",
        {
            "format": "greenroom.cluster.v1",
            "name": "warm",
            "model": MODEL,
            "sae_id": SAE,
            "intensity_range": [0.5, 1.5],
            "members": [{"feature": 5, "strength": 100, "label": "greeting"}, {"feature": 9, "strength": -40}],
        },
    ),
    (
        "/api/circuits/import",
        {
            "format": "greenroom.circuit.v1",
            "name": "greet",
            "model": MODEL,
            "rung": 2,
            "intensity_range": [0.5, 1.5],
            "layers": [{"layer": 15, "members": [{"feature": 7, "strength": 120}]}],
        },
    ),
)
TIMEOUT_MS = 90_000  # a generation on 2 busy cores


@pytest.fixture(scope="module")
def console(tmp_path_factory, smollm2, cache):
    """The server: the module's own cache (its steering store stays out of the session's), SmolLM2's
    conversion linked in from the session's."""
    srv = Server(tmp_path_factory.mktemp("console"), cache, CONFIG)
    for path, body in DOCUMENTS:
        httpx.post(srv.url + path, json=body, headers=AUTH, timeout=60).raise_for_status()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def artifacts(request) -> Path:
    """tmp/artifacts/console in the checkout (ignored by git; pytest's own tmp folders are pruned by
    the next sessions), emptied first."""
    folder = ROOT / "tmp" / "artifacts" / "console"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    request.config.pluginmanager.get_plugin("terminalreporter").write_line(f"console screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


class Watched:
    """A page and what its console and its scripts complained of."""

    def __init__(self, browser, url: str, width: int, height: int):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url + "/ui/")
        self.page.fill("#key", KEY)  # the server needs its key: the page asks first
        self.page.click("#key-form button")

    def shot(self, folder: Path, name: str) -> None:
        self.page.screenshot(path=str(folder / f"{name}.png"))
        assert self.errors == [], self.errors

    def chat(self) -> None:
        self.page.click("a[href='#chat']")
        self.page.click("#send")
        self.page.wait_for_selector("#answer[data-done=true]")
        self.page.wait_for_selector("#plain[data-done=true]")


@pytest.fixture(scope="module")
def desktop(browser, console):
    watched = Watched(browser, console.url, 1280, 800)
    yield watched
    watched.page.close()


def test_the_files_are_served_open_with_a_strict_policy(console):
    page = httpx.get(console.url + "/ui/", timeout=10)  # no key: the page holds no data, and asks for it
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["cache-control"] == "no-cache"
    again = httpx.get(console.url + "/ui/", headers={"If-None-Match": page.headers["etag"]}, timeout=10)
    assert again.status_code == 304 and again.content == b""
    script = httpx.get(console.url + "/ui/console.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    missing = httpx.get(console.url + "/ui/secret.js", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    assert httpx.get(console.url + "/api/actors", timeout=10).status_code == 401  # the API still needs it
    assert httpx.get(console.url + "/", timeout=10).json()["api_key_required"] is True


def test_tree_with_the_key_and_the_pages_weight(desktop, artifacts, request):
    page = desktop.page
    page.wait_for_selector("#actors tbody tr")
    assert {"supervisor", "steering", "cpu"} <= set(page.locator("#actors tbody tr td:first-child").all_inner_texts())
    row = page.locator("#models tbody tr", has_text=MODEL)
    assert "loaded" in row.inner_text() and row.locator("button").inner_text() == "Unload"
    figures = page.evaluate(
        """() => {
        const nav = performance.getEntriesByType("navigation")[0];
        const files = [nav, ...performance.getEntriesByType("resource").filter((r) => r.name.includes("/ui/"))];
        const paint = performance.getEntriesByName("first-contentful-paint")[0];
        return {bytes: files.reduce((n, r) => n + r.encodedBodySize, 0), files: files.length,
                first_contentful_paint_ms: paint && paint.startTime};
    }"""
    )
    (artifacts / "page.json").write_text(json.dumps(figures))
    request.config.pluginmanager.get_plugin("terminalreporter").write_line(f"console page: {figures}")
    assert figures["files"] == 3 and figures["bytes"] < 64_000, figures  # the page, its script, its style
    assert figures["first_contentful_paint_ms"] is not None
    desktop.shot(artifacts, "tree-1280")


def test_chat_streams_steered_and_unsteered_with_the_headers(desktop, artifacts):
    page = desktop.page
    page.click("a[href='#chat']")
    page.fill("#prompt", "Tell me about the sea.")
    page.fill("#seed", "7")
    page.fill("#max-tokens", "12")  # enough to see, short on 2 cores
    page.fill("#intensity", "max")
    page.click("#send")
    page.wait_for_function(
        "() => document.getElementById('answer').textContent.length > 0"
    )  # streamed: text while running
    page.wait_for_selector("#answer[data-done=true]")
    page.wait_for_selector("#plain[data-done=true]")
    assert page.inner_text("#answer").strip() and page.inner_text("#plain").strip()
    headers = page.inner_text("#answer-headers")
    assert 'x-millm-seed\n7;scope="request"' in headers and "x-request-id" in headers
    page.fill("#intensity", "")
    desktop.chat()
    desktop.shot(artifacts, "chat-1280")


def test_heatmap_a_dashboard_and_a_slider_in_both_units_that_changes_the_text(desktop, artifacts, console, tmp_path):
    page = desktop.page
    answer = page.inner_text("#answer")
    page.click("a[href='#features']")
    tokens = page.locator("#heatmap span")
    assert tokens.count() >= 2 and "".join(tokens.all_inner_texts()) == answer
    tokens.first.click()
    rows = page.locator("#token-features tbody tr")
    assert rows.count() == 8  # top_k 8 at that position
    feature = int(rows.first.locator("td").first.inner_text())
    _dashboard(console, feature, tmp_path / "corpus.txt", answer)
    rows.first.locator("button").click()
    page.wait_for_selector("#dashboard .context")
    assert page.inner_text("#feature-title") == f"{SAE} feature {feature} — seaside"  # its label
    assert page.locator("#dashboard .logits code").count() == 6  # logit_k 3 promoted, 3 suppressed
    assert page.locator("#dashboard .context span.picked").count() >= 1  # each context's peak token
    sae = httpx.get(f"{console.url}/api/saes/{SAE}?model={MODEL}", headers=AUTH, timeout=10).json()
    per = sae["residual_norm"] / (100 * sae["decoder_norms"][feature])  # the coefficient a strength of 1 is
    page.locator("#strength").fill("200")  # a range input: its input and change events fire
    page.wait_for_selector("#regenerated[data-done=true]")
    loud = page.inner_text("#regenerated")
    assert loud.strip() and loud != answer
    assert float(page.input_value("#coefficient")) == pytest.approx(200 * per, rel=1e-5)  # shown beside it
    assert _live(console) == {SAE: {str(feature): 200.0}}
    coefficient = round(50 * per, 3)  # typed: the server converts it, the slider shows the strength
    page.fill("#coefficient", str(coefficient))
    page.locator("#coefficient").dispatch_event("change")
    page.wait_for_selector("#regenerated[data-done=true]")
    strength = _live(console)[SAE][str(feature)]
    assert strength == pytest.approx(coefficient / per, rel=1e-6) and 49 < strength < 51
    assert float(page.inner_text("#strength-value")) == pytest.approx(strength, rel=1e-5)
    assert page.inner_text("#regenerated").strip() not in ("", loud, answer)
    desktop.shot(artifacts, "features-1280")


def _live(console) -> dict:
    return httpx.get(console.url + "/api/steering", headers=AUTH, timeout=10).json()["models"][0]["strengths"]


def _dashboard(console, feature: int, corpus: Path, answer: str) -> None:
    """A dashboard of `feature` on a small corpus (the answer it fired on, and a line), and a
    label: what the feature panel shows."""
    corpus.write_text(f"{answer}\nWaves break on the harbour wall at dusk.\n")
    sae = f"{console.url}/api/saes/{SAE}"
    job = httpx.post(
        sae + "/dashboards",
        headers=AUTH,
        timeout=30,
        json={
            "features": [feature],
            "corpus": {"files": [str(corpus)]},
            "context_tokens": 8,
            "top_k": 2,
            "logit_k": 3,
        },
    ).json()
    for _ in range(240):
        status = httpx.get(f"{sae}/dashboards/{job['id']}", headers=AUTH, timeout=10).json()["status"]
        if status != "queued" and status != "running":
            break
        time.sleep(0.25)
    assert status == "done", status
    labelled = httpx.put(f"{sae}/features/{feature}/label", headers=AUTH, json={"label": "seaside"}, timeout=10)
    labelled.raise_for_status()


def test_profiles_clusters_and_circuits(desktop, artifacts, console):
    page = desktop.page
    page.click("a[href='#steering']")
    page.locator("#profiles tbody tr", has_text="loud").locator("button").click()
    page.wait_for_selector("#profiles .badge")
    assert "active: profile loud" in page.inner_text("#live")
    assert [r.inner_text().split("\t")[0] for r in page.locator("#profiles tbody tr").all()] == ["loud"]
    page.locator("#profiles button", has_text="Off").click()  # toggled off: nothing active
    page.wait_for_function("() => document.getElementById('live').textContent.includes('active: none')")
    page.locator("#clusters input[type=range]").fill("1.5")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('dialled to 1.5')")
    dialled = httpx.get(console.url + "/api/clusters/warm", headers=AUTH, timeout=10).json()
    assert dialled["intensity"] == 1.5
    circuit = page.locator("#circuits tbody tr", has_text="greet")
    assert "2: causally validated (edge)" in circuit.inner_text()
    circuit.locator("button").click()
    page.wait_for_selector("#circuits .badge")
    assert "circuit" in page.locator("#circuits tbody tr", has_text="greet").inner_text()  # serving mode
    desktop.shot(artifacts, "steering-1280")
    desktop.chat()
    assert 'x-millm-circuit-rung\n2; language="causally validated (edge)"' in page.inner_text("#answer-headers")


def test_a_monitoring_plot_draws(desktop, artifacts, console):
    page = desktop.page
    page.click("a[href='#monitoring']")
    page.fill("#mon-topk", "3")
    page.locator("#mon-topk").dispatch_event("change")
    page.check("#mon-enabled")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('monitoring on, top 3')")
    config = httpx.get(console.url + "/api/monitoring", headers=AUTH, timeout=10).json()["models"][0]
    assert config["enabled"] and config["top_k"] == 3
    desktop.chat()  # the answer and its unsteered twin: two records
    page.click("a[href='#monitoring']")
    page.wait_for_selector("#mon-plot circle")  # polled every 2 s
    page.wait_for_function("() => document.querySelectorAll('#mon-plot circle').length >= 6")
    assert page.locator("#mon-legend span").count() >= 3
    assert page.locator("#mon-plot polyline").count() == page.locator("#mon-legend span").count()
    page.select_option("#mon-value", "mean")  # each feature's mean over the positions fed, not its max
    assert "mean activation" in page.inner_text("#mon-note") and page.locator("#mon-plot circle").count() >= 6
    desktop.shot(artifacts, "monitoring-1280")


def test_a_phone_sized_window(browser, console, artifacts):
    phone = Watched(browser, console.url, 390, 844)
    page = phone.page
    page.wait_for_selector("#actors tbody tr")
    page.click("a[href='#chat']")
    page.fill("#max-tokens", "12")
    phone.chat()
    assert page.inner_text("#answer").strip()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width  # nothing wider than the screen: wide tables scroll in their own box
    top_of_plain = page.locator("#plain-pane").bounding_box()["y"]
    assert top_of_plain > page.locator("#answer").bounding_box()["y"]  # the pair stacks
    phone.shot(artifacts, "chat-390")
    page.close()
