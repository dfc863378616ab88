"""A real headless browser for the page tests: Debian's chromium driven by Playwright (no browser download).

Playwright's sync API runs an asyncio loop of its own in the thread that starts it, which must not be the test's
thread (pytest-asyncio runs its fixtures' loops there), so the browser lives on a thread of its own and every call
is handed to it. Without chromium or Playwright the tests that need it skip, saying how to install them; CI installs
both (.ci/run: apt-get install chromium; make install: playwright from the test extra).
"""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CHROMIUM_ENV = "CHROMIUM"  # a chromium other than the one on PATH
INSTALL = "apt-get install -y chromium (Debian/Ubuntu) and pip install playwright (in the test extra)"


def chromium_path() -> str | None:
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return named if Path(named).is_file() else None
    for candidate in ("chromium", "chromium-browser"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


class Browser:
    """Chromium on its own thread; `call` runs a function there and returns its result."""

    def __init__(self, executable: str):
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="playwright")
        self._playwright = self._browser = None
        self.call(self._start, executable)

    def call(self, function, *args, **kwargs):
        return self._thread.submit(function, *args, **kwargs).result()

    def _start(self, executable: str) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        # root (CI's containers) cannot use chromium's sandbox; the pages are local files of our own
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        self._browser = self._playwright.chromium.launch(executable_path=executable, args=args)

    def new_tab(self, **options) -> "Tab":
        return Tab(self, self.call(self._browser.new_page, **options))

    def close(self) -> None:
        def stop():
            if self._browser is not None:
                self._browser.close()
            if self._playwright is not None:
                self._playwright.stop()

        try:
            self.call(stop)
        finally:
            self._thread.shutdown()


class Tab:
    """A Playwright page whose methods (goto, evaluate, click, fill, ...) run on the browser's thread."""

    def __init__(self, browser: Browser, page):
        self._browser = browser
        self._page = page

    def on(self, event: str, handler) -> None:
        self._browser.call(self._page.on, event, handler)  # handlers run on the browser's thread

    def __getattr__(self, name: str):
        method = getattr(self._page, name)
        return lambda *args, **kwargs: self._browser.call(method, *args, **kwargs)


def launch_or_skip() -> Browser:
    executable = chromium_path()
    if executable is None:
        pytest.skip(f"browser tests need chromium, which is not installed: {INSTALL}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip(f"browser tests need Playwright, which is not installed: {INSTALL}")
    return Browser(executable)
