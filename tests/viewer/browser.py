"""Drive a page in headless Chromium over the DevTools pipe: load, evaluate, screenshot.

The report tests' ``tests/report/headless_chromium.py`` loads a page and checks it;
the viewer also has to *use* the page (move the slider, switch the distance) and read
what it drew. This reuses that module's browser discovery, flags and pipe reader, and
adds a list of JavaScript expressions evaluated in order after the load event (their
values returned), with console errors, exceptions and non-file requests recorded.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.report.headless_chromium import FLAGS, _Pipe


@dataclass
class Session:
    values: list = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)


def drive_page(browser: str, url: str, expressions: list[str], *, user_data_dir: Path,
               screenshot: Path | None = None, width: int = 1280, height: int = 1400,
               timeout: float = 60.0) -> Session:
    """Load ``url``, evaluate each expression (``returnByValue``), then screenshot."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()

    def wire_fds():  # in the child: DevTools reads fd 3 and writes fd 4
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    cmd = [browser, *FLAGS, f"--user-data-dir={user_data_dir}",
           f"--window-size={width},{height}", "about:blank"]
    log = open(str(user_data_dir) + ".log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            preexec_fn=wire_fds, close_fds=False)
    os.close(to_child_r)
    os.close(from_child_w)
    pipe = _Pipe(proc, to_child_w, from_child_r)
    out = Session()
    deadline = time.monotonic() + timeout
    seen: list[dict] = []

    def note(event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                               for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            out.console_errors.append(f"{d.get('text')} "
                                      f"{d.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            out.console_errors.append(params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            req = params.get("request", {}).get("url", "")
            if not req.startswith(("file:", "data:", "about:")):
                out.external_requests.append(req)
        seen.append(event)

    def next_message():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the browser did not answer in time")
        try:
            message = pipe.events.get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError("the browser did not answer in time") from None
        if message is None:
            raise RuntimeError("the browser exited")
        return message

    def call(method, params=None, session=None):
        wanted = pipe.send(method, params, session)
        while True:
            message = next_message()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            note(message)

    def wait_for(name: str, session: str) -> None:
        if any(e.get("method") == name and e.get("sessionId") == session for e in seen):
            return
        while True:
            message = next_message()
            note(message)
            if message.get("method") == name and message.get("sessionId") == session:
                return

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
        wait_for("Page.loadEventFired", session)
        for expression in expressions:
            result = call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                               "awaitPromise": True}, session=session)
            if "exceptionDetails" in result:
                out.console_errors.append(json.dumps(result["exceptionDetails"])[:500])
                out.values.append(None)
            else:
                out.values.append(result["result"].get("value"))
        if screenshot is not None:
            shot = call("Page.captureScreenshot", {"format": "png"}, session=session)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        settle = time.monotonic() + 0.3
        while time.monotonic() < settle:
            try:
                message = pipe.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if message is None:
                break
            note(message)
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
    return out
