"""The built documentation site as a reader's browser shows it: headless Chromium (Debian's
package) opens the home page and an API reference page, served over HTTP from site/, and this
looks at what rendered: the title, the navigation, a code block, the benchmark chart loaded (a
natural width above zero), and no error on the console.

Not part of ``./run tests`` (the file's name keeps pytest from collecting it): ``./run docs
check`` installs Chromium when missing, builds the site and runs it. Chromium is driven through its
DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages ending in a NUL byte on
file descriptors 3 and 4), so no driver package is needed.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"
TIMEOUT_S = 60


class Browser:
    """One headless Chromium and one page of it, spoken to in DevTools protocol messages."""

    def __init__(self, profile: Path):
        binary = shutil.which("chromium")
        assert binary, (
            "Chromium is not installed: apt-get install -y chromium (./run docs check does)"
        )
        to_chromium, self._write = os.pipe()
        self._read, from_chromium = os.pipe()

        def descriptors() -> None:  # in the child: its fd 3 reads commands, fd 4 answers
            commands, answers = os.dup(to_chromium), os.dup(from_chromium)  # above 4 both
            os.dup2(commands, 3)
            os.dup2(answers, 4)

        self.process = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # CI and this machine run as root
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            preexec_fn=descriptors,
            pass_fds=(3, 4),  # kept after preexec_fn, which made them
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
                "sessionId"
            ]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable", session=True)
        except BaseException:
            self.close()
            raise

    def _message(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 16)
            assert chunk, "Chromium closed its DevTools pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, *, session: bool = False, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._message()
            if answer.get("id") == self._next_id:
                assert "error" not in answer, f"{method}: {answer['error']}"
                return answer["result"]
            self.events.append(answer)

    def open(self, url: str) -> None:
        """Navigates to ``url`` and returns once it loaded and its scripts settled."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + TIMEOUT_S
        while not any(event.get("method") == "Page.loadEventFired" for event in self.events):
            assert time.monotonic() < deadline, f"{url} did not load in {TIMEOUT_S} s"
            self.events.append(self._message())
        time.sleep(1)  # the theme's scripts (search index, navigation) run after load
        self.evaluate("1")  # collects the events sent meanwhile

    def evaluate(self, expression: str):
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Runtime.exceptionThrown":
                errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(f"{params['entry']['text']} ({params['entry'].get('url', '')})")
        return errors

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        os.close(self._write)
        os.close(self._read)


@pytest.fixture(scope="module")
def site_url():
    assert (SITE / "index.html").is_file(), "build the site first: ./run docs"
    handler = functools.partial(QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield browser
    browser.close()


def test_the_home_page_renders_its_title_navigation_code_and_the_chart(browser, site_url):
    browser.open(f"{site_url}/index.html")

    assert browser.evaluate("document.title") == "merlin_torch_serving"
    heading = browser.evaluate("document.querySelector('article h1').childNodes[0].textContent")
    assert heading == "merlin_torch_serving"
    navigation = browser.evaluate(
        "[...document.querySelectorAll('nav.md-nav--primary .md-nav__link')]"
        ".map(link => link.textContent.trim())"
    )
    for section in ("Getting started", "Concepts", "Guides", "Deployment", "API reference"):
        assert section in navigation, navigation
    code = browser.evaluate("document.querySelector('pre code').textContent")
    assert "./run demo" in code
    assert browser.console_errors() == []


def test_the_benchmark_chart_loads(browser, site_url):
    browser.open(f"{site_url}/benchmarks.html")

    chart = browser.evaluate(
        "(() => { const img = document.querySelector('img[src$=\"latest.png\"]');"
        " return img && {complete: img.complete, width: img.naturalWidth}; })()"
    )
    assert chart is not None, "no chart on the benchmark page"
    assert chart["complete"]
    assert chart["width"] > 0
    assert browser.console_errors() == []


def test_an_api_page_renders_a_class_its_signature_and_docstring(browser, site_url):
    browser.open(f"{site_url}/reference/index.html")
    link = browser.evaluate(
        "[...document.querySelectorAll('article a')]"
        ".find(link => link.textContent === 'PredictPytorch').href"
    )
    browser.open(link)

    # the page of the module that defines it, titled by the module
    assert browser.evaluate("document.title").endswith(" - merlin_torch_serving")
    heading = browser.evaluate("document.querySelector('[id$=\".PredictPytorch\"]').textContent")
    assert "PredictPytorch" in heading
    signature = browser.evaluate(
        "document.querySelector('[id$=\".PredictPytorch\"] ~ .doc-signature').textContent"
    )
    assert "max_sequence_length" in signature
    assert "Score rows" in browser.evaluate("document.querySelector('article').textContent")
    assert browser.console_errors() == []
