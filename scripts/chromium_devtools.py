"""A small DevTools-protocol client for headless Chromium: launch, navigate, evaluate, screenshot, console.

The tests and the benchmark's viewer timing drive a real browser (Debian's ``chromium``, WebGL through
SwiftShader) over the DevTools websocket with the ``websocket-client`` package, so what they see is what
a user's browser does. It imports nothing of the project, so both can share it: ``scripts/`` is on the
path of each (``scripts/bench`` and pytest's ``pythonpath``).
"""

import base64
import itertools
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websocket

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--use-gl=angle",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--ignore-gpu-blocklist",
    "--window-size=1200,900",
    "--remote-debugging-port=0",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # Tabs are driven one at a time: never let Chromium slow down a tab's timers or frames.
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
)
INSTALL_HINT = "install Debian's chromium (scripts/install-system-packages does, as root)"


class BrowserError(RuntimeError):
    """The browser did not start, or a DevTools command failed."""


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    """One DevTools endpoint (a tab, or the browser itself); a tab's console messages are collected."""

    def __init__(self, ws_url: str, page_domains: bool = True) -> None:
        self._ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self._ids = itertools.count(1)
        self.console: list[str] = []
        self.exceptions: list[str] = []
        self.responses: list[tuple[str, str]] = []  # (URL, protocol) of each response, once Network is enabled
        if page_domains:  # the browser's own endpoint has no page, runtime or log domain
            self.send("Runtime.enable")
            self.send("Page.enable")
            self.send("Log.enable")

    def close(self) -> None:
        self._ws.close()

    def _record(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            self.console.append(f"{entry.get('level')}: {entry.get('text')} {entry.get('url', '')}".rstrip())
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            self.responses.append((str(response.get("url")), str(response.get("protocol"))))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.exceptions.append(str(details.get("exception", {}).get("description", details.get("text"))))

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result, recording the events that arrive meanwhile."""
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._record(message)

    def navigate(self, url: str) -> None:
        """Open ``url`` and wait for its load event."""
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout=60)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises are awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} threw {details.get('exception', {}).get('description', details)}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, interval: float = 0.5) -> Any:
        """Poll a JavaScript expression until it is truthy and return it; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(interval)
        raise BrowserError(f"{expression!r} still {value!r} after {timeout} s; console: {self.console[-20:]}")

    def capture(self) -> bytes:
        """A PNG of the viewport."""
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def screenshot(self, path: Path) -> Path:
        """Write a PNG of the viewport to ``path``."""
        path.write_bytes(self.capture())
        return path


class Browser:
    """A headless Chromium with a fresh profile, driven through its browser-level DevTools endpoint."""

    def __init__(self, profile_dir: Path, flags: Sequence[str] = ()) -> None:
        """Start Chromium on ``profile_dir``, with ``flags`` after the usual ones."""
        executable = chromium_path()
        if executable is None:
            raise BrowserError(f"no chromium on PATH: {INSTALL_HINT}")
        profile_dir.mkdir(parents=True, exist_ok=True)
        self._log = (profile_dir.parent / f"{profile_dir.name}-chromium.log").open("wb")
        port_file = profile_dir / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)  # a reused profile's old port is not this browser's
        self.process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError(f"chromium did not start; see {self._log.name}")
            time.sleep(0.1)
        port, browser_path = port_file.read_text().splitlines()[:2]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._browser = Page(f"ws://127.0.0.1:{port}{browser_path}", page_domains=False)

    @contextmanager
    def page(self) -> Iterator[Page]:
        """A tab in a browser context of its own, closed afterwards.

        A fresh context has its own HTTP cache, also for Neuroglancer's web workers, so every page asks
        the server again instead of revalidating what an earlier page fetched.
        """
        context = self._browser.send("Target.createBrowserContext")["browserContextId"]
        target = self._browser.send("Target.createTarget", url="about:blank", browserContextId=context)["targetId"]
        page = Page(f"{self.endpoint.replace('http://', 'ws://')}/devtools/page/{target}")
        page.send("Page.bringToFront")  # a background tab may not draw animation frames
        page.send("Emulation.setFocusEmulationEnabled", enabled=True)
        try:
            yield page
        finally:
            page.close()
            self._browser.send("Target.closeTarget", targetId=target)
            self._browser.send("Target.disposeBrowserContext", browserContextId=context)

    def close(self) -> None:
        if hasattr(self, "_browser"):
            self._browser.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()
