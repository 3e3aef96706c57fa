"""A real headless browser for the tests: Debian's chromium driven through its chromedriver with selenium.

`browser()` opens a fresh browser (its own throw-away profile, no network of its own: no sync, no component
updates, no background requests) and closes it, by its driver, when the block ends. Tests call `need_browser()`
first: where no chromium or chromedriver is installed it skips the test with a message that says what to
install (`.ci/run` installs both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["browser", "find_browser", "need_browser", "FLAGS"]

#: Headless, and nothing the browser would do on its own: no GPU, no QUIC, no first-run pages, no background
#: networking, component updates or sync (the tests' machine reaches no outside address anyway).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> tuple[str, str] | None:
    """(browser binary, driver binary), or None when either is missing."""
    binary = os.environ.get("PEERCRAWL_TEST_BROWSER") or next(filter(None, map(shutil.which, _BROWSERS)), None)
    driver = os.environ.get("PEERCRAWL_TEST_DRIVER") or shutil.which("chromedriver")
    if not binary or not driver:
        return None
    return binary, driver


def need_browser() -> tuple[str, str]:
    found = find_browser()
    if found is None:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver) to run the dashboard's browser tests")
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    return found


@contextmanager
def browser(width: int = 1400, height: int = 1100) -> Iterator[object]:
    """A selenium WebDriver on a fresh headless chromium; closed (browser and driver) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = need_browser()
    profile = Path(tempfile.mkdtemp(prefix="peercrawl-browser-"))
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
