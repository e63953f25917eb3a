"""A real headless Chromium (Debian's `chromium`), driven over the DevTools protocol, for the show tests.

`Browser.start()` launches `/usr/bin/chromium` (or `chromium` on PATH; `WDSPREP_CHROMIUM` names
another) with a fresh profile and the flags that keep it off the network, reads the DevTools port
from the profile's `DevToolsActivePort`, and attaches to its page over a websocket
(`websocket-client`). `open(path)` loads a file and returns what the page did: console errors,
exceptions, every request's URL, and values read off the page with `evaluate`. No browser is ever
downloaded; `unavailable()` says why none can run (the tests skip with that reason).
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--disable-extensions",
         "--remote-debugging-port=0", "--window-size=1280,1600")
START_TIMEOUT = 60.0
CALL_TIMEOUT = 60.0


def executable() -> str | None:
    named = os.environ.get("WDSPREP_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def unavailable() -> str | None:
    """Why no browser can run here, or None."""
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (the dev extra installs it)"
    if executable() is None:
        return "no chromium here (.ci/run installs Debian's chromium: apt-get install -y chromium)"
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="wdsprep-chromium-")
        self.process: subprocess.Popen | None = None
        self.socket = None
        self.next_id = 0
        self.events: list[dict] = []

    # -- lifetime
    def start(self) -> "Browser":
        binary = executable()
        log = open(os.path.join(self.profile, "stderr.log"), "wb")
        self.process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        log.close()
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + START_TIMEOUT
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"{binary} did not start: {self._stderr_tail()}")
            time.sleep(0.05)
        port = int(open(port_file).read().split()[0])
        targets = self._json(port, "/json/list", deadline)
        page = next((t for t in targets if t.get("type") == "page"), None)
        if page is None:
            raise BrowserError(f"{binary}: no page target ({targets})")
        import websocket

        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=CALL_TIMEOUT,
                                                  suppress_origin=True)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        return self

    def _json(self, port: int, path: str, deadline: float):
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    return json.loads(response.read())
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _stderr_tail(self) -> str:
        try:
            with open(os.path.join(self.profile, "stderr.log"), "rb") as handle:
                return handle.read()[-600:].decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def close(self) -> None:
        if self.socket is not None:
            try:
                self.socket.close()
            except Exception:
                pass
        if self.process is not None:
            # the browser and its helper processes: the process group this test started it in
            for signal_number in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, signal_number)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the protocol
    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        ident = self.next_id
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_TIMEOUT
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)
        raise BrowserError(f"{method}: no answer in {CALL_TIMEOUT} s")

    def wait_for(self, method: str, timeout: float = CALL_TIMEOUT) -> dict:
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = json.loads(self.socket.recv())
            if "method" in message:
                self.events.append(message)
                if message["method"] == method:
                    return message
        raise BrowserError(f"no {method} in {timeout} s")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    # -- what the tests use
    def open(self, path: str) -> "PageReport":
        self.events.clear()
        url = "file://" + os.path.abspath(path)
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        # every image decoded (or failed) before anything is read off the page
        self.evaluate("Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)))")
        return PageReport(self, url)

    def screenshot(self, path: str, width: int = 1280, height: int = 1600) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))


class PageReport:
    """What a loaded page did and holds."""

    def __init__(self, browser: Browser, url: str):
        self.browser, self.url = browser, url

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (e.g. a blocked request)."""
        found = []
        for event in self.browser.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                found.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:300])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append("log: " + params["entry"].get("text", ""))
        return found

    def requests(self) -> list[str]:
        urls = [event["params"]["request"]["url"] for event in self.browser.events
                if event["method"] == "Network.requestWillBeSent"]
        return [url[:40] if url.startswith("data:") else url for url in urls]

    def images(self) -> list[dict]:
        return self.browser.evaluate(
            "Array.from(document.images).map(i => ({panel: i.dataset.panel, complete: i.complete, "
            "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight, src: i.src.slice(0, 22), "
            "sample: i.closest('[data-index]') ? i.closest('[data-index]').dataset.index : null}))")

    def counts(self) -> list[dict]:
        """Every `data-count` element: its name, its split (closest `data-split`) and its number."""
        return self.browser.evaluate(
            "Array.from(document.querySelectorAll('[data-count]')).map(e => ({name: e.dataset.count, "
            "split: e.closest('[data-split]') ? e.closest('[data-split]').dataset.split : null, "
            "field: e.closest('[data-field]') ? e.closest('[data-field]').dataset.field : null, "
            "value: Number(e.textContent)}))")

    def samples(self) -> list[dict]:
        return self.browser.evaluate(
            "Array.from(document.querySelectorAll('.sample')).map(e => ({split: e.dataset.split, "
            "index: Number(e.dataset.index), key: e.dataset.key, problems: e.querySelectorAll('.problem').length}))")
