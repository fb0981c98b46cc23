"""Headless Chromium driven over the Chrome DevTools protocol, and a local site server that
is also the browser's only proxy — so every request the browser makes is seen and logged.

Used by test_docs_site.py. Debian's ``chromium`` is started with the flags the project
requires (--headless --no-sandbox --disable-gpu --disable-background-networking
--disable-component-update --disable-sync, a fresh --user-data-dir) and
``--proxy-server`` pointing at :class:`SiteServer` with loopback not bypassed: a request
to any host, this machine included, goes to the server, which serves the site for its
own address and refuses (and records) everything else.
"""

from __future__ import annotations

import base64
import http.server
import itertools
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket  # websocket-client

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# Chromium's own services (autofill, time sync, account checks, updates) still call home
# with the flags above; these turn them off so that every request left is the site's.
QUIET_FLAGS = (
    "--disable-features=AutofillServerCommunication,OptimizationHints,MediaRouter,"
    "Translate,NetworkTimeServiceQuerying,CertificateTransparencyComponentUpdater",
    "--disable-client-side-phishing-detection",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--disable-extensions",
    "--no-pings",
    "--metrics-recording-only",
    "--no-service-autorun",
    "--password-store=basic",
    "--use-mock-keychain",
    "--disable-signin-promo",
    "--allow-browser-signin=false",
)


class BrowserError(RuntimeError):
    pass


# what Chromium answers an evaluation made while the page navigates away
NAVIGATING = ("Inspected target navigated or closed", "Cannot find context with specified id",
              "Execution context was destroyed")


# --- the server ---------------------------------------------------------------------------


@dataclass
class RequestLog:
    lock: threading.Lock = field(default_factory=threading.Lock)
    served: list[str] = field(default_factory=list)  # URLs of this site
    refused: list[str] = field(default_factory=list)  # anything else: would have left

    def add(self, url: str, local: bool) -> None:
        with self.lock:
            (self.served if local else self.refused).append(url)


class SiteServer:
    """Serves ``root`` on 127.0.0.1 and acts as the browser's proxy."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = RequestLog()
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(server.root), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _target(self) -> tuple[str, str]:
                """(full URL, host:port) of the request, whether proxied or direct."""
                parts = urllib.parse.urlsplit(self.path)
                if parts.scheme:
                    return self.path, parts.netloc
                host = self.headers.get("Host", "")
                return f"http://{host}{self.path}", host

            def translate_path(self, path: str) -> str:
                return super().translate_path(urllib.parse.urlsplit(path).path or "/")

            def _handle(self, send: Callable[[], None]) -> None:
                url, host = self._target()
                local = host == server.netloc
                server.log.add(url, local)
                if local:
                    send()
                else:
                    self.send_error(403, "this test's proxy refuses requests off the machine")

            def do_GET(self) -> None:
                self._handle(super().do_GET)

            def do_HEAD(self) -> None:
                self._handle(super().do_HEAD)

            def do_POST(self) -> None:
                self._handle(lambda: self.send_error(405))

            def do_CONNECT(self) -> None:  # https through a proxy: never allowed here
                server.log.add(f"https://{self.path}", False)
                self.send_error(403, "this test's proxy refuses requests off the machine")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.netloc = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.netloc}/"

    def __enter__(self) -> SiteServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


# --- the browser --------------------------------------------------------------------------


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    raise BrowserError("Debian's chromium is not installed: apt-get install -y chromium")


class Browser:
    """One headless Chromium with one page, driven through a flat CDP session."""

    def __init__(self, profile_dir: Path, proxy: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.profile_dir = profile_dir
        args = [chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}",
                "--remote-debugging-port=0", "--no-first-run", "--no-default-browser-check",
                "--window-size=1280,900", f"--proxy-server=http://{proxy}", *QUIET_FLAGS,
                "--proxy-bypass-list=<-loopback>", "about:blank"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.ws = websocket.create_connection(self._browser_ws(), timeout=timeout)
        self.session = self._attach_page()

    def _browser_ws(self) -> str:
        port_file = self.profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrowserError(f"chromium exited with status {self.process.returncode}")
            if port_file.is_file():
                lines = port_file.read_text().split("\n")
                if len(lines) >= 2 and lines[1]:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.1)
        raise BrowserError("chromium did not open its DevTools port")

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)
        raise BrowserError(f"{method}: no reply in {self.timeout} s")

    def _event(self, message: dict[str, Any]) -> None:
        if "method" not in message:
            return
        self.events.append(message)
        if message["method"] == "Target.attachedToTarget":  # a worker of the page
            session = message["params"]["sessionId"]
            for method in ("Network.enable", "Runtime.runIfWaitingForDebugger"):
                self.ws.send(json.dumps({"id": next(self._ids), "method": method,
                                         "params": {}, "sessionId": session}))

    def _attach_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        sid = session["sessionId"]
        for method in ("Page.enable", "Network.enable", "Runtime.enable"):
            self.send(method, session=sid)
        self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                           "flatten": True}, session=sid)
        return sid

    def pump(self, seconds: float) -> None:
        """Read events for a while (requests of workers arrive as events)."""
        deadline = time.monotonic() + seconds
        self.ws.settimeout(0.1)
        try:
            while time.monotonic() < deadline:
                try:
                    self._event(json.loads(self.ws.recv()))
                except websocket.WebSocketTimeoutException:
                    pass
        finally:
            self.ws.settimeout(self.timeout)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=self.session)
        if "exceptionDetails" in result:
            raise BrowserError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, seconds: float | None = None) -> Any:
        deadline = time.monotonic() + (seconds or self.timeout)
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError as err:
                # asked while a click's navigation replaces the page: ask the new one
                if not any(m in str(err) for m in NAVIGATING):
                    raise
                value = None
            if value:
                return value
            self.pump(0.2)
        raise BrowserError(f"timed out waiting for {what}")

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url}, session=self.session)
        self.wait_for(f"document.readyState === 'complete' && location.href === {json.dumps(url)}",
                      f"{url} to load")

    def type_text(self, text: str) -> None:
        for ch in text:
            for kind in ("keyDown", "keyUp"):
                params = {"type": kind, "key": ch}
                if kind == "keyDown":
                    params["text"] = ch
                self.send("Input.dispatchKeyEvent", params, session=self.session)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport":
                                                    True}, session=self.session)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def set_width(self, width: int, height: int = 900) -> None:
        """Lay the page out as in a desktop window ``width`` CSS pixels wide."""
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=self.session)
        self.pump(0.1)

    def requested_urls(self) -> list[str]:
        """Every URL the page and its workers asked for, as CDP reported it."""
        return [e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:  # the browser may already be gone; it is killed below anyway
            pass
        try:
            self.ws.close()
        finally:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


# --- what a reader would notice -------------------------------------------------------------

# Text of the page outside code, with the math delimiters KaTeX should have consumed.
RAW_MATH_JS = r"""
(() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const left = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest("pre, code, script, style, textarea, .katex")) continue;
    const text = n.textContent;
    if (/\\\(|\\\)|\\\[|\\\]|\$\$/.test(text)) left.push(text.trim().slice(0, 80));
  }
  return left;
})()
"""
MATH_STATS_JS = r"""
(() => ({
  arithmatex: document.querySelectorAll(".arithmatex").length,
  katex: document.querySelectorAll(".arithmatex .katex").length,
  errors: document.querySelectorAll(".katex-error").length,
  title: document.title,
}))()
"""

# Display equations, code blocks and tables whose content a reader cannot see whole:
# an equation or a code block whose content is wider than its box (it would have to be
# scrolled or is cut off: both must break or wrap instead); a table that runs past the
# article with no visible scroll bar to reach the rest (scrolling visibly is allowed).
# What makes a page scroll sideways on a phone: the page wider than the window, and each
# equation, code block, table, image or diagram that runs past the window without a box
# of its own (or around it) that scrolls; a figure drawn narrower than 600 px (or its own
# width) is reported too, as its text is then too small to read.
SIDEWAYS_JS = r"""
(() => {
  const out = [];
  const vw = document.documentElement.clientWidth;
  const page = document.documentElement.scrollWidth - vw;
  if (page > 1) out.push({kind: "page", hidden: page});
  const article = document.querySelector("article") || document.body;
  const name = (el) => (el.textContent || el.getAttribute("src") || "").trim()
    .replace(/\s+/g, " ").slice(0, 60);
  const kinds = "div.arithmatex, pre > code, table, img, div.gs-dataflow > svg";
  for (const el of article.querySelectorAll(kinds)) {
    let scroller = null;
    for (let box = el; box && box !== document.body; box = box.parentElement) {
      const style = getComputedStyle(box);
      if (["auto", "scroll"].includes(style.overflowX) && box.scrollWidth > box.clientWidth + 1) {
        scroller = box;
        break;
      }
    }
    const r = (scroller || el).getBoundingClientRect();
    if (r.right > vw + 1) out.push({kind: el.tagName.toLowerCase(), hidden: r.right - vw, text: name(el)});
    if (el.tagName === "IMG" || el.tagName.toLowerCase() === "svg") {
      const natural = el.naturalWidth || el.width.baseVal?.value || 0;
      const shown = el.getBoundingClientRect().width;
      if (natural && shown + 1 < Math.min(600, natural))
        out.push({kind: "figure", shown: Math.round(shown), text: name(el)});
    }
  }
  return out;
})()
"""

CLIPPED_JS = r"""
(() => {
  const article = document.querySelector("article") || document.body;
  // Material lets a table's frame reach into the content's margin: measure against that.
  const right = (article.closest(".md-content") || article).getBoundingClientRect().right + 1;
  const out = [];
  const name = (el) => (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 60);
  for (const el of article.querySelectorAll("div.arithmatex")) {
    const hidden = el.scrollWidth - el.clientWidth;
    const past = el.getBoundingClientRect().right - right;
    if (hidden > 1 || past > 0)
      out.push({kind: "equation", hidden: Math.max(hidden, past), text: name(el)});
  }
  for (const el of article.querySelectorAll("pre > code")) {
    const hidden = Math.max(el.scrollWidth - el.clientWidth,
                            el.parentElement.scrollWidth - el.parentElement.clientWidth);
    if (hidden > 1) out.push({kind: "code", hidden: hidden, text: name(el)});
  }
  for (const el of article.querySelectorAll("table")) {
    let box = el.parentElement, scroller = null;
    for (; box && box !== article; box = box.parentElement) {
      const style = getComputedStyle(box);
      if (["auto", "scroll"].includes(style.overflowX) && box.scrollWidth > box.clientWidth) {
        scroller = box;
        break;
      }
    }
    if (scroller) {  // it scrolls: the frame is in view and its scroll bar is drawn
      const bar = scroller.offsetHeight - scroller.clientHeight;
      const past = scroller.getBoundingClientRect().right - right;
      if (bar <= 0 || past > 0)
        out.push({kind: "table", hidden: scroller.scrollWidth - scroller.clientWidth,
                  text: name(el), why: bar <= 0 ? "no scroll bar" : "frame past the page"});
    } else {
      const past = el.getBoundingClientRect().right - right;
      if (past > 0) out.push({kind: "table", hidden: past, text: name(el)});
    }
  }
  return out;
})()
"""


def off_machine(urls: list[str], netloc: str) -> list[str]:
    """The URLs that would have left the machine (anything not this site, data: or blob:)."""
    bad = []
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("data", "blob", "about", "chrome-error"):
            continue
        if parts.netloc != netloc:
            bad.append(url)
    return bad
