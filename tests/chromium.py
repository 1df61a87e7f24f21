"""Headless Chromium driven over the DevTools protocol on a pipe, with the standard library only.

``--remote-debugging-pipe`` makes Chromium read commands from fd 3 and write answers and events
to fd 4, each a JSON message ended by a NUL byte: no websocket client, no playwright (neither is
available offline). Used by the report's browser test and by scripts/report_screenshot.py.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    for name in NAMES:
        exe = shutil.which(name)
        if exe:
            return exe
    return None


class ChromiumError(RuntimeError):
    pass


class Chromium:
    """One headless browser; :meth:`open_page` loads a file and reports what happened."""

    def __init__(self, exe: str | None = None, timeout: float = 60.0) -> None:
        exe = exe or find_chromium()
        if exe is None:
            raise ChromiumError("no chromium found: apt-get install -y chromium")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="tc-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, its fd 4 writes to us
            a, b = os.dup(cmd_r), os.dup(res_w)  # above 4 or not: never clobbered by the dup2 below
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        flags = [
            "--headless",
            "--no-sandbox",  # root in CI
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={self.profile}",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-sync",
            "--hide-scrollbars",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            [exe, *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            close_fds=False,
        )
        os.close(cmd_r)
        os.close(res_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._res_r], [], [], left)[0]:
                raise ChromiumError("chromium did not answer in time")
            chunk = os.read(self._res_r, 1 << 20)
            if not chunk:
                raise ChromiumError(f"chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._next:
                if "error" in m:
                    raise ChromiumError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        for e in self.events:
            if e.get("method") == method and e.get("sessionId") == session:
                return e
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == method and m.get("sessionId") == session:
                return m

    def open_page(
        self, path: Path, width: int = 1400, screenshot: Path | None = None, probe: str | None = None
    ) -> dict[str, Any]:
        """Load ``path``; return its console errors, every request it made, each plot's size (figure.plot
        svg), with ``screenshot`` a full-page PNG written there, and with ``probe`` (a JavaScript
        expression evaluated by the browser, not by the page: its CSP allows no script) its value as
        ``probe``, passed through ``JSON.stringify``."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=s)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=s,
        )
        url = path.resolve().as_uri()
        nav = self.call("Page.navigate", {"url": url}, session=s)
        if nav.get("errorText"):
            raise ChromiumError(f"navigation failed: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", s)
        js = (
            "JSON.stringify([...document.querySelectorAll('figure.plot svg')]"
            ".map(e => {const r = e.getBoundingClientRect(); return [r.width, r.height]}))"
        )
        sizes = json.loads(
            self.call("Runtime.evaluate", {"expression": js, "returnByValue": True}, session=s)["result"]["value"]
        )
        out: dict[str, Any] = {"url": url, "plot_sizes": sizes}
        if probe is not None:
            got = self.call(
                "Runtime.evaluate", {"expression": f"JSON.stringify({probe})", "returnByValue": True}, session=s
            )
            if "exceptionDetails" in got:
                raise ChromiumError(f"probe failed: {got['exceptionDetails']}")
            out["probe"] = json.loads(got["result"]["value"])
        if screenshot is not None:
            size = self.call("Page.getLayoutMetrics", session=s)["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            shot = self.call(
                "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}, session=s
            )
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        mine = [e for e in self.events if e.get("sessionId") == s]
        errors = []
        for e in mine:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                errors.append(p.get("exceptionDetails", {}).get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                errors.append(p["entry"].get("text", ""))
        out["console_errors"] = errors
        out["requests"] = [
            e["params"]["request"]["url"] for e in mine if e.get("method") == "Network.requestWillBeSent"
        ]
        self.call("Target.closeTarget", {"targetId": target})
        return out
