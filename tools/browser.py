"""A headless Chromium driven over the DevTools protocol, with the standard library only.

Chromium is started with ``--remote-debugging-pipe``: it reads protocol commands from file
descriptor 3 and writes replies and events to descriptor 4, each message a JSON object followed
by a NUL byte (what Playwright and Puppeteer use under the hood). Nothing is downloaded: the
browser is the system's (``/usr/bin/chromium``, Debian's ``chromium`` package), started with a
fresh profile in a temporary folder and the flags that keep it off the network except for the
pages it is asked to open. ``Browser.close`` (or leaving the ``with`` block) ends it by PID.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page (tab) in it."""

    def __init__(self, executable: str = CHROMIUM, *, width: int = 1600, height: int = 1000,
                 timeout: float = 30.0):
        if not Path(executable).is_file():
            raise BrowserError(f"{executable}: no Chromium (apt-get install -y chromium)")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="lime-chromium-")
        to_child, self._w = os.pipe()  # we write commands, Chromium reads them on fd 3
        self._r, from_child = os.pipe()  # Chromium writes on fd 4

        def fds() -> None:  # in the child, before exec: the pipe ends become fds 3 and 4
            a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child))  # out of the way first
            os.dup2(a, 3)
            os.dup2(b, 4)

        argv = [executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
                f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(argv, pass_fds=(3, 4), preexec_fn=fds,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._next = 0
        self._events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        # frames in other processes (a sandboxed iframe, such as MLflow's artifact viewer) attach
        # as sessions of their own: ``frame_eval`` evaluates in them
        self.page("Target.setAutoAttach", autoAttach=True, waitForDebuggerOnStart=False, flatten=True)
        self.page("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    # -- the protocol ------------------------------------------------------------------------------
    def call(self, method: str, session: str | None = None, **params: Any) -> dict:
        """Send one command, wait for its reply (events that arrive meanwhile are kept)."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == self._next:
                    if "error" in m:
                        raise BrowserError(f"{method}: {m['error'].get('message')}")
                    return m.get("result", {})
                self._events.append(m)

    def page(self, method: str, **params: Any) -> dict:
        return self.call(method, self.session, **params)

    def _read(self, deadline: float) -> list[dict]:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout:g} s")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError("Chromium closed the DevTools pipe (it exited)")
                self._buf += chunk
        *msgs, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in msgs if m]

    # -- what a check needs ------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        res = self.page("Page.navigate", url=url)
        if res.get("errorText"):
            raise BrowserError(f"{url}: {res['errorText']}")

    def eval(self, expression: str) -> Any:
        res = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:60]}: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def frame_eval(self, expression: str) -> list:
        """``expression`` in every frame attached as a session of its own (out-of-process iframes)."""
        self.eval("1")  # read the events that arrived meanwhile
        attached = {e["params"]["sessionId"]: e["params"]["targetInfo"] for e in self._events
                    if e.get("method") == "Target.attachedToTarget"}
        detached = {e["params"].get("sessionId") for e in self._events
                    if e.get("method") == "Target.detachedFromTarget"}
        out = []
        for sid, info in attached.items():
            if sid in detached or info.get("type") != "iframe":
                continue
            try:
                res = self.call("Runtime.evaluate", sid, expression=expression, returnByValue=True, awaitPromise=True)
            except BrowserError:
                continue
            out.append(res.get("result", {}).get("value"))
        return out

    def text(self) -> str:
        """The page's rendered text (what a reader sees, without markup)."""
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def wait_for(self, predicate, timeout: float = 60.0, every: float = 0.5) -> str:
        """Poll the rendered text until ``predicate(text)`` holds; the text, or BrowserError with its tail."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if predicate(text):
                return text
            time.sleep(every)
        raise BrowserError(f"not on the page within {timeout:g} s; it shows:\n{text[-2000:]}")

    def screenshot(self, path: str | Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.page("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size["width"],
                                                            "height": size["height"], "scale": 1})
        data = self.page("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """End Chromium (its whole process group, by PID) and remove its profile."""
        if self.proc.poll() is None:
            try:
                os.write(self._w, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
