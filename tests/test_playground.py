"""The playground page at / in headless Chromium (Debian's, driven by Playwright): it loads the model's
voices, a request streams, and the audio plays (the page reports samples received and played)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from http_harness import Server, running_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]
SAMPLES = 7 * 2048  # max_tokens 70 with ignore_eos: 10 frames, 7 emitted


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("playground"), "--greedy") as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server: Server) -> Iterator:  # noqa: ANN201
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), "install Debian's chromium (see the README's install command)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_selector("body[data-ready=true]", timeout=30_000)
            yield page
        finally:
            browser.close()


def test_page_loads_the_models_voices(page) -> None:  # noqa: ANN001
    assert page.title() == "vox-serve playground"
    assert page.text_content("#model") == "orpheus-tiny"
    voices = page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert voices[:2] == ["tara", "leah"]


def test_a_request_streams_and_its_audio_plays(page) -> None:  # noqa: ANN001
    page.fill("#text", "Hello from the browser.")
    page.select_option("#voice", "leo")
    page.fill("#extra", '{"max_tokens": 70, "ignore_eos": true}')
    page.click("#speak")
    page.wait_for_function("window.voxStats.done === true", timeout=60_000)
    stats = page.evaluate("window.voxStats")
    assert stats["error"] is None and stats["receivedSamples"] == SAMPLES
    assert stats["ttfaMs"] > 0 and stats["rtf"] > 0
    assert page.text_content("#samples") == str(SAMPLES) and page.text_content("#ttfa").endswith(" ms")
    assert stats["contextState"] == "running"
    page.wait_for_function(f"window.voxStats.playedSamples === {SAMPLES}", timeout=30_000)  # every chunk ended


def test_errors_are_shown(page) -> None:  # noqa: ANN001
    page.fill("#extra", '{"temperature": 99}')
    page.click("#speak")
    page.wait_for_function("window.voxStats.error !== null", timeout=30_000)
    assert "temperature" in page.text_content("#status")
    assert page.get_attribute("#status", "class") == "error"
