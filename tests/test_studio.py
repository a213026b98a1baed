"""The studio in a real headless browser (Debian's chromium and chromedriver,
driven by selenium) against a real `ctx serve --api-key`: log in, chat with a
streamed reply, branch from the second message, snapshot, restore, export,
delete, and the login gate that shows nothing without the key."""
from __future__ import annotations

import io
import shutil
import time

import httpx
import pytest
from PIL import Image, ImageStat
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from api_server import greedy_reply, running
from api_server import model  # noqa: F401 (fixture)
from ollama_layout import make_ollama_store

KEY = "studio-test-key"
WAIT_S = 60  # generous: two CPU cores are shared; a reply of a few tokens takes well under a second alone
AUTH = {"Authorization": f"Bearer {KEY}"}



@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    """With a key, and an Ollama store holding a model that cannot be served."""
    store = tmp_path_factory.mktemp("studio-ollama")
    make_ollama_store(store, "broken:1b", smollm2_path,
                      extra_layers=[("application/vnd.ollama.image.tensor", b"not a tensor")])
    with running(tmp_path_factory.mktemp("studio"), "--api-key", KEY, "--ollama-models", str(store)) as s:
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("the studio tests need Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run does)")
    downloads = tmp_path_factory.mktemp("downloads")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800"):
        opts.add_argument(arg)
    opts.binary_location = chromium
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver))
    d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                      {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    d.downloads = downloads
    yield d
    d.quit()


def wait(d, condition, what: str, timeout: float = WAIT_S):
    # A poll that meets an element the page has just re-rendered asks again.
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda _: condition())
    except TimeoutException:
        raise AssertionError(f"timed out waiting for {what}; the page says:\n{d.find_element(By.TAG_NAME, 'body').text}")


def css(d, selector):
    return d.find_elements(By.CSS_SELECTOR, selector)


def visible(d, element_id: str) -> bool:
    return d.find_element(By.ID, element_id).is_displayed()


def logged_in(d, server):
    """The studio open, past the login prompt."""
    d.get(f"{server.url}/studio")
    wait(d, lambda: visible(d, "login") or visible(d, "app"), "the page to start")
    if visible(d, "login"):
        d.find_element(By.ID, "login-key").send_keys(KEY, Keys.ENTER)
    wait(d, lambda: visible(d, "app"), "the app after logging in")
    return d


def confirm_dialog(d, value: str | None = None):
    dialog = wait(d, lambda: next(iter(css(d, "dialog[open]")), None), "the dialog")
    if value is not None:
        field = dialog.find_element(By.CSS_SELECTOR, "input")
        field.clear()
        field.send_keys(value)
    dialog.find_element(By.CSS_SELECTOR, "button[value=ok]").click()
    wait(d, lambda: not css(d, "dialog[open]"), "the dialog to close")


def send(d, text: str) -> str:
    """Type a message, and wait until its streamed reply has finished; the reply's text."""
    n = len(css(d, ".msg[data-role=assistant]"))
    d.find_element(By.ID, "prompt").send_keys(text, Keys.ENTER)
    wait(d, lambda: len(css(d, ".msg[data-role=assistant] .stat")) and not css(d, ".msg.streaming")
         and len(css(d, ".msg[data-role=assistant]")) > n, "the streamed reply")
    return css(d, ".msg[data-role=assistant]")[-1].find_element(By.CSS_SELECTOR, ".body").text


def set_field(d, selector: str, value: str):
    field = d.find_element(By.CSS_SELECTOR, selector)
    field.clear()
    field.send_keys(value)


def tree_row(d, key: str):
    return wait(d, lambda: next(iter(css(d, f'#tree [data-key="{key}"]')), None), f"{key} in the tree")


def open_title(d) -> str:
    return d.find_element(By.ID, "chat-title").text


def made_chat(server, name: str) -> str:
    """A context holding one chat turn (system, user, assistant), made through the API
    so that a test does not lean on what an earlier one left behind."""
    assert server.post("/v1/contexts", {"name": name, "system": "You are terse."}, headers=AUTH).status_code == 201
    r = server.post("/v1/chat/completions", {"model": "smollm2", "context": name, "max_tokens": 12,
                                             "temperature": 0, "messages": [{"role": "user", "content": "Name a colour."}]},
                    headers=AUTH)
    assert r.status_code == 200, r.text
    return name


def test_without_the_key_only_the_login_prompt_shows(server, browser):
    d = browser
    assert server.post("/v1/contexts", {"name": "secret-notes", "text": "the launch code is 1234"},
                       headers=AUTH).status_code == 201
    d.get(f"{server.url}/studio")
    d.execute_script("sessionStorage.clear()")
    d.refresh()
    wait(d, lambda: visible(d, "login"), "the login prompt")
    assert not visible(d, "app")
    d.find_element(By.ID, "login-key").send_keys("wrong-key", Keys.ENTER)
    wait(d, lambda: "refused" in d.find_element(By.ID, "login-error").text, "the refusal")
    assert not visible(d, "app") and not css(d, "#tree *")
    assert "secret-notes" not in d.page_source and "launch code" not in d.page_source
    # the data routes refuse without the key, whatever the page does
    assert httpx.get(f"{server.url}/v1/studio/tree").status_code == 401
    d.find_element(By.ID, "login-key").send_keys(KEY, Keys.ENTER)
    wait(d, lambda: visible(d, "app"), "the app")
    tree_row(d, "context:secret-notes")


def test_chat_streams_a_reply_with_its_settings(server, browser, model):
    d = logged_in(browser, server)
    d.find_element(By.ID, "new-context").click()
    set_field(d, "#system", "You are terse.")
    set_field(d, "input[name=temperature]", "0")
    set_field(d, "input[name=max_tokens]", "12")
    settings = d.find_element(By.ID, "settings-line").text
    assert "temperature 0" in settings and "max 12 tokens" in settings and "KV f16" in settings
    assert d.find_element(By.ID, "kv-chip").text == "KV f16"
    reply = send(d, "Name a colour.")
    want = greedy_reply(model, messages=[{"role": "system", "content": "You are terse."},
                                         {"role": "user", "content": "Name a colour."}], max_tokens=12)
    assert reply == want.strip() and reply
    stat = css(d, ".msg[data-role=assistant] .stat")[-1].text
    assert "tok/s" in stat and "temperature 0" in stat and "KV f16" in stat
    assert [m.get_attribute("data-role") for m in css(d, ".msg")] == ["system", "user", "assistant"]
    name = open_title(d)
    assert server.get(f"/v1/studio/contexts/{name}/messages", headers=AUTH).json()["messages"][2]["text"] == reply


def test_branch_from_the_second_message_makes_two_branches(server, browser):
    chat = made_chat(server, "to-branch")
    d = logged_in(browser, server)
    tree_row(d, f"context:{chat}").click()
    wait(d, lambda: open_title(d) == chat and len(css(d, ".msg")) == 3, "the chat to open")
    second = css(d, ".msg")[1]
    ActionChains(d).move_to_element(second).perform()
    second.find_element(By.CSS_SELECTOR, "[data-act=branch]").click()
    confirm_dialog(d, "other")
    wait(d, lambda: open_title(d) == "other", "the branch to open")
    assert [m.get_attribute("data-role") for m in css(d, ".msg")] == ["system", "user"]
    send(d, "And another?")
    branch = wait(d, lambda: next(iter(css(d, '#tree .row.branch[data-children="2"]')), None), "a branch point")
    # the branch point is the longest prefix the two share: the second message, and the next turn's opener
    a, b = (server.get(f"/v1/contexts/{n}", params={"tokens": "true"}, headers=AUTH).json()["tokens"]
            for n in (chat, "other"))
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    second_end = server.get(f"/v1/studio/contexts/{chat}/messages", headers=AUTH).json()["messages"][1]["end"]
    assert shared >= second_end and b[:second_end] == a[:second_end]
    assert branch.text.startswith(f"2 branches · {shared} tok")
    keys = [r.get_attribute("data-key") for r in css(d, "#tree [data-key]")]
    assert f"context:{chat}" in keys and "context:other" in keys


def test_snapshot_restore_export_and_delete(server, browser):
    made_chat(server, "to-save")
    d = logged_in(browser, server)
    tree_row(d, "context:to-save").click()
    wait(d, lambda: open_title(d) == "to-save", "the context to open")
    d.find_element(By.CSS_SELECTOR, "#chat-actions [data-act=snapshot]").click()
    confirm_dialog(d, "saved")
    tree_row(d, "snapshot:saved").click()
    wait(d, lambda: open_title(d) == "saved" and css(d, ".msg"), "the snapshot to open")
    d.find_element(By.CSS_SELECTOR, "#chat-actions [data-act=export]").click()
    exported = d.downloads / "saved.ctxsnap"
    wait(d, exported.exists, "the exported file")
    assert exported.read_bytes() == server.get("/v1/studio/refs/saved/export", headers=AUTH).content
    d.find_element(By.CSS_SELECTOR, "#chat-actions [data-act=restore]").click()
    confirm_dialog(d, "restored")
    wait(d, lambda: open_title(d) == "restored", "the restored context to open")
    got = server.get("/v1/contexts/restored", params={"tokens": "true"}, headers=AUTH).json()
    want = server.get("/v1/contexts/to-save", params={"tokens": "true"}, headers=AUTH).json()
    assert got["tokens"] == want["tokens"]
    d.find_element(By.CSS_SELECTOR, "#chat-actions [data-act=delete]").click()
    confirm_dialog(d)
    wait(d, lambda: not css(d, '#tree [data-key="context:restored"]'), "the deleted context to leave the tree")
    assert server.get("/v1/contexts/restored", headers=AUTH).status_code == 404


def test_models_store_live_figures_and_a_screenshot(server, browser):
    # Loaded here, not by whichever test ran before this one.
    r = server.post("/v1/chat/completions", {"model": "smollm2", "max_tokens": 1,
                                             "messages": [{"role": "user", "content": "Hi"}]}, headers=AUTH)
    assert r.status_code == 200, r.text
    d = logged_in(browser, server)
    def model_card():  # found again on every poll: the list is re-rendered as the figures change
        return next(iter(css(d, '#models [data-model="smollm2"]')), None)

    wait(d, model_card, "the model list")
    wait(d, lambda: "loaded" in model_card().text and "KV f16" in model_card().text, "smollm2 loaded")
    broken = d.find_element(By.CSS_SELECTOR, '#models [data-model="broken:1b"]').text
    assert "cannot serve" in broken and "safetensors" in broken
    wait(d, lambda: css(d, '#store [data-stat="refs"]'), "store stats")
    d.find_element(By.ID, "gc").click()
    wait(d, lambda: "Collected" in d.find_element(By.ID, "toast").text, "the gc result")
    # the plots fill from /metrics once a second; tokens/s saw the earlier replies only if they were
    # inside its window, so look for drawn lines, not for a value
    wait(d, lambda: len(css(d, "#plots polyline")) >= 3, "the live plots")
    shot = Image.open(io.BytesIO(d.get_screenshot_as_png())).convert("L")
    assert shot.size == (1280, 800)
    assert ImageStat.Stat(shot).stddev[0] > 10, "the screenshot is (nearly) one colour"
