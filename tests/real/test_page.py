"""The chat page of llamaspec serve in a real headless browser: Debian's chromium driven by
selenium through the system's chromedriver, named explicitly (nothing is downloaded), against a
real server on 127.0.0.1 (SmolLM2). ``scripts/test_setup.sh`` installs the browser and tmux."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from checks import Server
from conftest import THREADS

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
KEY = "page-key"
WAIT = 240  # seconds a reply may take on a busy 2-core machine
# where the screenshot of the exchange goes besides the test's own folder (docs/chat-page.png was
# taken so: LLAMASPEC_PAGE_SCREENSHOT=docs/chat-page.png python -m pytest tests/real/test_page.py)
SCREENSHOT = os.environ.get("LLAMASPEC_PAGE_SCREENSHOT")
# what the escaping server's grammar makes every reply: markup a page that parsed it would act on
MARKUP = '<b>bold</b> <img src=x onerror="window.pwned=1"> <script>window.pwned=2</script> &amp; done'


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=900,760",
                "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def keyed(smol):
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--api-key", KEY)
    yield server
    server.stop()


def answers(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".message.assistant")


def ask(driver, text: str) -> object:
    """Type ``text`` and press Enter; the reply's element once its stream has ended."""
    n = len(answers(driver))
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(text)
    box.send_keys("\n")  # Enter sends
    WebDriverWait(driver, WAIT).until(lambda d: len(answers(d)) > n and answers(d)[n].get_attribute("data-done"))
    return answers(driver)[n]


def test_the_page_asks_for_the_key_streams_coloured_replies_and_keeps_the_chat(browser, keyed, tmp_path):
    browser.get(keyed.url + "/")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    assert "API key" in browser.find_element(By.ID, "error").text
    browser.find_element(By.ID, "api-key").send_keys(KEY + "\n")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "model").text)
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("48")

    first = ask(browser, "Repeat exactly: The quick brown fox jumps over the lazy dog. "
                         "The quick brown fox jumps over the lazy dog.")
    tokens = first.find_elements(By.CSS_SELECTOR, ".tok[data-source]")
    sources = [t.get_attribute("data-source") for t in tokens]
    assert len(tokens) > 10 and "plain" in sources and set(sources) - {"plain"}, sources
    assert "".join(t.get_attribute("textContent") for t in tokens) == first.find_element(
        By.CLASS_NAME, "text").get_attribute("textContent")
    assert tokens[-1].get_attribute("title").startswith(sources[-1] + ", step ")
    assert "t/s decode" in browser.find_element(By.ID, "reply-stats").text
    legend = {t.get_attribute("data-source") for t in browser.find_elements(By.CSS_SELECTOR, "#legend .tok")}
    assert set(sources) <= legend

    second = ask(browser, "Now say it once, in capitals.")
    assert second.find_elements(By.CSS_SELECTOR, ".tok[data-source]")
    messages = browser.find_elements(By.CSS_SELECTOR, ".message")
    assert [m.get_attribute("class") for m in messages] == ["message user", "message assistant"] * 2
    shares = browser.find_element(By.ID, "chat-stats").text
    assert "plain" in shares and "%" in shares
    shot = tmp_path / "chat-page.png"
    browser.save_screenshot(str(shot))
    assert 10_000 < shot.stat().st_size < 200_000
    if SCREENSHOT:
        shutil.copy(shot, SCREENSHOT)

    browser.find_element(By.ID, "spec").clear()
    browser.find_element(By.ID, "spec").send_keys("lookup,nosuch")
    box = browser.find_element(By.ID, "prompt")
    box.send_keys("Hello\n")
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.ID, "error").is_displayed())
    error = browser.find_element(By.ID, "error").text
    assert "'nosuch' is not a draft source" in error and "\n" not in error
    assert len(answers(browser)) == 2 and box.get_attribute("value") == "Hello"  # the question is kept to resend

    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, ".message")


def test_shift_enter_starts_a_new_line_stop_ends_a_reply_and_the_page_files_need_no_key(browser, keyed):
    browser.get(keyed.url + "/")
    box = browser.find_element(By.ID, "prompt")
    box.send_keys("one")
    webdriver.ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    box.send_keys("two")
    assert box.get_attribute("value") == "one\ntwo" and not answers(browser)
    box.clear()
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "key-form").is_displayed())
    browser.find_element(By.ID, "api-key").send_keys(KEY + "\n")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "model").text)
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("2000")
    box.send_keys("Write a very long story about a cat who sails around the world.\n")
    WebDriverWait(browser, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant .tok"))
    browser.find_element(By.ID, "stop").click()
    WebDriverWait(browser, 60).until(lambda d: answers(d)[0].get_attribute("data-done") == "stopped")
    assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_enabled()
    for path in ("/page/chat.js", "/page/chat.css"):
        assert browser.execute_script(f"return fetch('{path}').then(r => r.status)") == 200
    assert keyed.get("/metrics")[0] == 401  # the figures are guarded like the API


@pytest.fixture(scope="module")
def forced(smol, tmp_path_factory):
    grammar = tmp_path_factory.mktemp("page") / "markup.gbnf"
    grammar.write_text(f"root ::= {json.dumps(MARKUP)}\n")
    server = Server("-m", smol, "-t", str(THREADS), "-c", "2048", "--grammar-file", str(grammar))
    yield server
    server.stop()


def test_a_reply_of_markup_is_shown_as_text(browser, forced):
    browser.get(forced.url + "/")
    reply = ask(browser, "Say anything.")
    shown = reply.find_element(By.CLASS_NAME, "text").get_attribute("textContent")
    assert shown == MARKUP
    assert not browser.find_elements(By.CSS_SELECTOR, "#chat b, #chat img, #chat script")
    assert browser.execute_script("return window.pwned === undefined")
    assert "grammar" in {t.get_attribute("data-source") for t in reply.find_elements(By.CSS_SELECTOR, ".tok")}


def status_of(url: str, origin: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Origin": origin}), timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_page_is_served_to_its_own_origin_not_to_another_s(forced):
    assert status_of(forced.url + "/", forced.url) == 200
    assert status_of(forced.url + "/page/chat.js", "http://evil.example") == 403
    assert status_of(forced.url + "/page/..%2Fpage.py", forced.url) == 404  # the page's files, no other
