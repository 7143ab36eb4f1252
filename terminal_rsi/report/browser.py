"""A minimal headless-Chromium driver over the DevTools protocol (stdlib only).

Used by the report's browser test and by `python -m terminal_rsi.report.browser` to take
screenshots of a report page. The browser is the system's Chromium (Debian: `apt-get
install chromium`; `.ci/setup_report.sh`); nothing is downloaded. The protocol runs over
`--remote-debugging-pipe` (NUL-delimited JSON on file descriptors 3 and 4, as Playwright
and Puppeteer do), so no WebSocket library or open port is needed.

    with Browser.launch() as browser:
        page = browser.new_page(width=1280, height=900)
        page.goto("file:///.../index.html")
        page.wait_for("document.body.dataset.ready === '1'")
        n = page.evaluate("document.querySelectorAll('tr').length")
        page.screenshot("shot.png", selector="#heatmap")
        assert not page.errors  # console errors, uncaught exceptions, failed loads
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser could not be started, or a DevTools command failed or timed out."""


def find_chromium() -> str | None:
    """Path of a Chromium binary: $CHROMIUM, else the first of chromium, chromium-browser,
    google-chrome on PATH (Debian's wrapper's real binary is preferred when present)."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if os.path.exists(env) or shutil.which(env) else None
    real = "/usr/lib/chromium/chromium"  # Debian: skip the wrapper script's shell noise
    if os.access(real, os.X_OK):
        return real
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _high_fd(fd: int) -> int:
    """Move `fd` to a number >= 10 (close-on-exec), clear of the browser's 3 and 4."""
    import fcntl

    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    """A Chromium process driven over the DevTools pipe. Use `Browser.launch()`."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int,
                 profile: str, timeout: float):
        self._proc = proc
        self._out = to_browser
        self._in = from_browser
        self._profile = profile
        self.timeout = timeout
        self._next_id = 0
        self._lock = threading.Lock()
        self._pending: dict[int, queue.Queue] = {}
        self._listeners: dict[str, list] = {}  # sessionId -> [callback(method, params)]
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    @classmethod
    def launch(cls, executable: str | None = None, *, timeout: float = 30.0,
               extra_args: tuple[str, ...] = ()) -> Browser:
        exe = executable or find_chromium()
        if not exe:
            raise BrowserError("no Chromium found: install Debian's chromium "
                               "(`bash .ci/setup_report.sh` as root) or set $CHROMIUM")
        profile = tempfile.mkdtemp(prefix="trsi-chromium-")
        # pipe A: we write, the browser reads it as fd 3; pipe B: the browser writes fd 4.
        # The fds are moved to >= 10 and a bash `exec` puts them on 3 and 4, so no Python
        # runs between fork and exec (no preexec_fn: safe next to JAX's threads).
        a_r, a_w = (_high_fd(fd) for fd in os.pipe())
        b_r, b_w = (_high_fd(fd) for fd in os.pipe())
        bash = shutil.which("bash")
        if bash is None:
            raise BrowserError("bash is needed to hand the DevTools pipe to Chromium")
        args = [exe, "--headless", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps", "--mute-audio",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--force-color-profile=srgb",
                *(("--no-sandbox",) if os.geteuid() == 0 else ()), *extra_args,
                "about:blank"]
        script = f'exec 3<&{a_r} 4>&{b_w} {a_r}<&- {b_w}>&- {a_w}>&- {b_r}<&- "$0" "$@"'
        try:
            proc = subprocess.Popen([bash, "-c", script, *args], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    pass_fds=(a_r, b_w))
        except OSError as e:
            for fd in (a_r, a_w, b_r, b_w):
                os.close(fd)
            shutil.rmtree(profile, ignore_errors=True)
            raise BrowserError(f"cannot start {exe}: {e}") from e
        os.close(a_r)
        os.close(b_w)
        browser = cls(proc, a_w, b_r, profile, timeout)
        try:
            browser.send("Browser.getVersion")
        except BrowserError:
            browser.close()
            raise
        return browser

    # -- protocol ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if "id" in msg:
                    q = self._pending.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    for cb in list(self._listeners.get(msg.get("sessionId", ""), ())):
                        cb(msg.get("method", ""), msg.get("params", {}))
        for q in list(self._pending.values()):  # the browser went away: wake every waiter
            q.put({"error": {"message": "browser pipe closed"}})

    def send(self, method: str, params: dict | None = None, *, session: str | None = None,
             timeout: float | None = None) -> dict:
        """Send one DevTools command and wait for its result (BrowserError on error)."""
        with self._lock:
            self._next_id += 1
            mid = self._next_id
            q: queue.Queue = queue.Queue()
            self._pending[mid] = q
            msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
            if session:
                msg["sessionId"] = session
            data = json.dumps(msg).encode() + b"\0"
            try:
                while data:
                    data = data[os.write(self._out, data):]
            except OSError as e:
                self._pending.pop(mid, None)
                raise BrowserError(f"{method}: browser pipe closed ({e})") from e
        try:
            reply = q.get(timeout=timeout or self.timeout)
        except queue.Empty:
            raise BrowserError(f"{method}: no reply within {timeout or self.timeout} s") from None
        finally:
            self._pending.pop(mid, None)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def new_page(self, width: int = 1280, height: int = 900) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        self._listeners.setdefault(session, []).append(page._on_event)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return page

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.send("Browser.close", timeout=5)
        except BrowserError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One tab. `errors` collects console errors, uncaught exceptions and failed loads."""

    def __init__(self, browser: Browser, session: str):
        self.browser = browser
        self.session = session
        self.errors: list[str] = []
        self.console: list[str] = []
        self._loaded = threading.Event()

    def send(self, method: str, params: dict | None = None, **kw) -> dict:
        return self.browser.send(method, params, session=self.session, **kw)

    def _on_event(self, method: str, params: dict) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert"):
                self.errors.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            desc = d.get("exception", {}).get("description") or d.get("text", "")
            self.errors.append(f"uncaught exception: {desc} ({d.get('url', '')}:"
                               f"{d.get('lineNumber', '?')})")
        elif method == "Log.entryAdded":
            e = params.get("entry", {})
            if e.get("level") == "error":
                self.errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}")

    def goto(self, url: str, timeout: float | None = None) -> None:
        self._loaded.clear()
        res = self.send("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError(f"cannot open {url}: {res['errorText']}")
        if not self._loaded.wait(timeout or self.browser.timeout):
            raise BrowserError(f"{url} did not finish loading")

    def evaluate(self, expression: str) -> Any:
        """Evaluate a JS expression (promises awaited) and return its JSON value."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise BrowserError(f"evaluate({expression[:80]!r}): "
                               f"{d.get('exception', {}).get('description') or d.get('text')}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r}; page errors: "
                                   f"{self.errors}")
            time.sleep(0.05)

    def screenshot(self, path: str | os.PathLike, selector: str | None = None,
                   max_height: int = 4000) -> bytes:
        """PNG of the viewport, or of the element matching `selector` (scrolled into view),
        written to `path`; returns the bytes."""
        params: dict[str, Any] = {"format": "png"}
        if selector is not None:
            rect = self.evaluate(
                "(() => { const e = document.querySelector(" + json.dumps(selector) + ");"
                " if (!e) return null; e.scrollIntoView(); const r = e.getBoundingClientRect();"
                " return {x: r.left + window.scrollX, y: r.top + window.scrollY,"
                " width: r.width, height: r.height}; })()")
            if not rect or rect["width"] <= 0 or rect["height"] <= 0:
                raise BrowserError(f"screenshot: no visible element matches {selector!r}")
            rect["height"] = min(rect["height"], max_height)
            params.update(clip={**rect, "scale": 1}, captureBeyondViewport=True)
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return data


def main(argv: list[str] | None = None) -> int:
    """`python -m terminal_rsi.report.browser PAGE OUT.png [--selector CSS] [--click CSS]`:
    open a page (a path or URL) headless and save a screenshot."""
    import argparse
    import pathlib

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("page")
    ap.add_argument("out")
    ap.add_argument("--selector", default=None, help="element to capture (default: viewport)")
    ap.add_argument("--click", default=None, help="element to click first")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    a = ap.parse_args(argv)
    url = a.page if "://" in a.page else pathlib.Path(a.page).resolve().as_uri()
    with Browser.launch() as browser:
        page = browser.new_page(a.width, a.height)
        page.goto(url)
        page.wait_for("document.readyState === 'complete'")
        if a.click:
            page.evaluate(f"document.querySelector({json.dumps(a.click)}).click()")
        if a.selector:
            page.wait_for(f"!!document.querySelector({json.dumps(a.selector)})")
        page.screenshot(a.out, selector=a.selector)
        for e in page.errors:
            print("page error:", e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
