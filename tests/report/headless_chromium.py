"""Open a page in headless Chromium over the DevTools pipe and report what happened.

``--remote-debugging-pipe`` makes Chromium read DevTools commands from fd 3 and
write replies and events to fd 4, NUL-separated JSON, so no websocket client or
free port is needed. ``inspect_page`` loads a file URL, waits for the load event,
decodes every ``<img>``, records console errors, uncaught exceptions, log errors
and every request that is not ``file:`` or ``data:``, and saves a full-page
screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--remote-debugging-pipe",
)

IMAGE_CHECK = """
Promise.all(Array.from(document.images).map(img =>
  img.decode().then(
    () => ({alt: img.alt, ok: true, w: img.naturalWidth, h: img.naturalHeight}),
    err => ({alt: img.alt, ok: false, w: img.naturalWidth, h: img.naturalHeight,
             error: String(err)}))))
  .then(r => JSON.stringify(r))
"""


def find_chromium() -> str | None:
    """Path of a Chromium-family browser: $ATTNGEOM_CHROMIUM, /usr/bin/chromium, PATH."""
    env = os.environ.get("ATTNGEOM_CHROMIUM")
    if env and Path(env).exists():
        return env
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageReport:
    images: list[dict] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    title: str = ""
    page_height: float = 0.0
    screenshot: Path | None = None
    values: list = field(default_factory=list)  # of ``expressions``, in order


class _Pipe:
    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc = proc
        self.write_fd = write_fd
        self.events: queue.Queue = queue.Queue()
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        buffer = b""
        with os.fdopen(fd, "rb", buffering=0) as stream:
            while True:
                chunk = stream.read(1 << 16)
                if not chunk:
                    self.events.put(None)
                    return
                buffer += chunk
                while b"\0" in buffer:
                    message, buffer = buffer.split(b"\0", 1)
                    self.events.put(json.loads(message))

    def send(self, method: str, params=None, session: str | None = None):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        return self._next_id


def inspect_page(browser: str, url: str, *, user_data_dir: Path, screenshot: Path | None,
                 width: int = 1280, height: int = 900, max_height: int = 16000,
                 timeout: float = 40.0, expressions: Sequence[str] = ()) -> PageReport:
    """Load ``url`` in a fresh headless browser and return a ``PageReport``.

    ``expressions`` (JavaScript) are evaluated in order after the load event, as a user's
    actions would be (move a slider, switch a view); their values land in
    ``report.values`` (None, with the exception among the console errors, where one
    throws). ``screenshot=None`` takes none.
    """
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()

    def wire_fds():  # runs in the child: DevTools expects fd 3 (in) and fd 4 (out)
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    cmd = [browser, *FLAGS, f"--user-data-dir={user_data_dir}",
           f"--window-size={width},{height}", "about:blank"]
    log_path = Path(str(user_data_dir) + ".log")
    log = open(log_path, "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            preexec_fn=wire_fds, close_fds=False)
    # close_fds=False keeps the dup2'ed fds 3 and 4; every other fd Python opened is
    # non-inheritable (PEP 446) and closes on exec anyway.
    os.close(to_child_r)
    os.close(from_child_w)
    pipe = _Pipe(proc, to_child_w, from_child_r)
    report = PageReport()
    deadline = time.monotonic() + timeout
    pending_events: list[dict] = []

    def collect(event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            report.console_errors.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            report.console_errors.append(f"exception: {details.get('text')} "
                                         f"{details.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            report.console_errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            req_url = params.get("request", {}).get("url", "")
            if not req_url.startswith(("file:", "data:", "about:")):
                report.external_requests.append(req_url)
        pending_events.append(event)

    def call(method, params=None, session=None):
        wanted = pipe.send(method, params, session)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no reply to {method} within {timeout} s")
            try:
                message = pipe.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if message is None:
                raise RuntimeError(f"browser exited while waiting for {method}; see {log_path}")
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            collect(message)

    def wait_event(name: str, session: str):
        for i, event in enumerate(pending_events):
            if event.get("method") == name and event.get("sessionId") == session:
                return pending_events.pop(i)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {name} event within {timeout} s")
            try:
                message = pipe.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if message is None:
                raise RuntimeError(f"browser exited while waiting for {name}")
            collect(message)
            if message.get("method") == name and message.get("sessionId") == session:
                return message

    try:
        targets = call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = call("Target.attachToTarget", {"targetId": page["targetId"],
                                                 "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            call(f"{domain}.enable", session=session)
        call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                    "deviceScaleFactor": 1, "mobile": False},
             session=session)
        call("Page.navigate", {"url": url}, session=session)
        wait_event("Page.loadEventFired", session)
        for expression in expressions:
            result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, session=session)
            if "exceptionDetails" in result:
                report.console_errors.append(
                    "exception: " + json.dumps(result["exceptionDetails"])[:500])
                report.values.append(None)
            else:
                report.values.append(result["result"].get("value"))
        result = call("Runtime.evaluate", {"expression": IMAGE_CHECK, "awaitPromise": True,
                                           "returnByValue": True}, session=session)
        report.images = json.loads(result["result"]["value"])
        report.title = call("Runtime.evaluate", {"expression": "document.title",
                                                 "returnByValue": True},
                            session=session)["result"]["value"]
        metrics = call("Page.getLayoutMetrics", session=session)
        page_height = metrics.get("cssContentSize", metrics.get("contentSize"))["height"]
        report.page_height = float(page_height)
        if screenshot is not None:
            shot = call("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width,
                         "height": min(page_height, max_height), "scale": 1}},
                session=session)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            report.screenshot = screenshot
        # Give late console messages (e.g. a failed decode logged after load) a moment.
        settle = time.monotonic() + 0.3
        while time.monotonic() < settle:
            try:
                message = pipe.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if message is None:
                break
            collect(message)
        try:
            pipe.send("Browser.close")
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(to_child_w)
        log.close()
    return report
