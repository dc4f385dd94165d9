"""The chat page at `/` in a real headless Chromium (Debian's chromium + chromedriver, driven
with selenium): type a prompt, watch the reply stream in, press stop.

`scripts/test-openai-client.sh` starts the server and passes its address in TINYNN_SERVER.
"""

import os
import shutil
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

BASE = os.environ["TINYNN_SERVER"]
SHOT = os.environ.get("TINYNN_CHAT_SCREENSHOT")


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def text_of(el):
    return el.get_attribute("textContent")


def test_type_see_the_reply_stream_and_stop(browser):
    wait = WebDriverWait(browser, 60)
    browser.get(BASE + "/")
    assert browser.title == "tinynn chat"
    # The server was started with an API key: the page asks for it; give it in the settings.
    wait.until(lambda d: "API key" in text_of(d.find_element(By.ID, "model")))
    browser.find_element(By.ID, "toggle-settings").click()
    key = browser.find_element(By.ID, "api_key")
    key.send_keys("test-key")
    wait.until(lambda d: ".gguf" in text_of(d.find_element(By.ID, "model")))
    browser.find_element(By.ID, "max_tokens").clear()
    browser.find_element(By.ID, "max_tokens").send_keys("400")
    browser.find_element(By.ID, "temperature").clear()
    browser.find_element(By.ID, "temperature").send_keys("0")

    # A short question: the reply streams in and ends by itself.
    prompt = browser.find_element(By.ID, "prompt")
    prompt.send_keys("Name three colors.")
    prompt.send_keys(Keys.ENTER)
    reply = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant"))[-1]
    wait.until(lambda d: reply.get_attribute("data-state") != "streaming")
    assert reply.get_attribute("data-state") == "done"
    assert len(text_of(reply).strip()) > 0
    assert "tokens/s" in text_of(browser.find_element(By.ID, "stats"))
    assert text_of(browser.find_elements(By.CSS_SELECTOR, ".msg.user")[-1]) == "Name three colors."

    # A long one: text appears piece by piece; Stop ends it and the text stops growing.
    prompt.send_keys("Count from 1 to 500, separated by commas.")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2)
    reply = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    wait.until(lambda d: len(text_of(reply)) > 0)
    seen = [len(text_of(reply))]
    deadline = time.time() + 60
    while len(set(seen)) < 3 and time.time() < deadline:
        time.sleep(0.05)
        seen.append(len(text_of(reply)))
    assert len(set(seen)) >= 3, "the reply should grow in several steps (streamed)"
    assert browser.find_element(By.ID, "send").get_attribute("disabled") is not None
    if SHOT:
        browser.save_screenshot(SHOT)
    browser.find_element(By.ID, "stop").click()
    wait.until(lambda d: reply.get_attribute("data-state") == "stopped")
    stopped_at = text_of(reply)
    time.sleep(0.5)
    assert text_of(reply) == stopped_at
    assert "stopped" in text_of(browser.find_element(By.ID, "stats"))
    assert browser.find_element(By.ID, "send").get_attribute("disabled") is None
    # The server let go of the slot.
    import urllib.request

    deadline = time.time() + 5
    while time.time() < deadline:
        metrics = urllib.request.urlopen(BASE + "/metrics", timeout=5).read().decode()
        if "\ntinynn_slots_busy 0\n" in metrics:
            break
        time.sleep(0.05)
    assert "\ntinynn_slots_busy 0\n" in metrics
