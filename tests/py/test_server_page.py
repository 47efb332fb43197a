"""The chat page of `spark serve` in headless Chromium (Debian's chromium,
driven by Playwright): type a message, watch the reply stream in, press
stop, check the server cancelled the generation, then a second message with
thinking off runs to the end. The final page is saved as
BUILD/artifacts/chat_page.png."""
import os
import time

import pytest

from test_server_support import Server, artifacts_dir, server_model

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return server_model(tmp_path_factory.mktemp("serve-page"))


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium; `make deps` does it as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


def text_of(page, selector):
    return page.eval_on_selector(selector, "e => e.textContent")


def test_chat_page_streams_and_stops(model, browser):
    srv = Server(model, "--parallel", 1)
    try:
        page = browser.new_page(viewport={"width": 1100, "height": 720})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url("/"))
        page.wait_for_function("document.getElementById('model').textContent.includes('" + model.name + "')")

        # 1: a long reply (thinking on: it streams into the reasoning box); stop it mid-way
        page.fill("#max_tokens", "1500")
        page.fill("#seed", "7")
        page.fill("#system", "You are a terse assistant.")
        page.fill("#input", "Tell me a long story about the sea.")
        page.click("#send")
        page.wait_for_selector(".msg.assistant details.reasoning")
        page.wait_for_function("document.querySelector('.reasoning-text').textContent.length > 20")
        first = len(text_of(page, ".reasoning-text"))
        page.wait_for_function(f"document.querySelector('.reasoning-text').textContent.length > {first + 20}")
        assert page.is_enabled("#stop") and not page.is_enabled("#send")
        assert srv.health()["sessions_active"] == 1
        page.click("#stop")
        page.wait_for_function("!document.getElementById('send').disabled")
        assert not page.is_enabled("#stop")
        stopped_at = len(text_of(page, ".reasoning-text"))
        assert "stopped" in text_of(page, ".msg.assistant .stats")
        assert "tok/s" in text_of(page, ".msg.assistant .stats")
        # the server noticed the hang-up and freed the session
        t0 = time.time()
        srv.wait_idle(timeout=10)
        assert time.time() - t0 < 5
        assert srv.metrics()["spark_requests_cancelled_total"] == 1
        time.sleep(0.3)
        assert len(text_of(page, ".reasoning-text")) == stopped_at  # nothing more arrives

        # 2: thinking off, a short reply that runs to its end
        page.uncheck("#thinking")
        page.fill("#max_tokens", "40")
        page.fill("#input", "And now a short answer, please.")
        page.press("#input", "Enter")
        page.wait_for_function("document.querySelectorAll('.msg.assistant').length == 2 && "
                               "!document.getElementById('send').disabled", timeout=120000)
        last = page.query_selector_all(".msg.assistant")[-1]
        assert last.query_selector("details.reasoning") is None
        assert len(last.query_selector(".content").text_content()) > 10
        assert "40 tokens" in last.query_selector(".stats").text_content()
        assert "length" in last.query_selector(".stats").text_content()
        assert len(page.query_selector_all(".msg.user")) == 2
        assert not errors, errors
        page.screenshot(path=str(artifacts_dir() / "chat_page.png"), full_page=True)
        page.close()
    finally:
        srv.stop()
