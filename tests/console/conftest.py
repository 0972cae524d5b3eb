"""The console app in process: a `WorkspaceTarget` (real board, policy, audit log, status) and an httpx
client that speaks ASGI to the app directly, as a browser on the console's address would."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright

from ipybox.console.app import ConsoleApp, console_app
from tests.console.targets import WorkspaceTarget

SCREENSHOTS = Path(__file__).resolve().parents[2] / ".cache" / "screenshots"
CHROMIUM = "/usr/bin/chromium"  # Debian's: Playwright downloads no browser of its own here
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    # No connections of its own: this machine's closed network refuses them, many at a time.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

PORT = 8765
ORIGIN = f"http://127.0.0.1:{PORT}"


@pytest.fixture
def target(tmp_path: Path) -> WorkspaceTarget:
    return WorkspaceTarget(tmp_path)


@pytest.fixture
def console(target: WorkspaceTarget) -> ConsoleApp:
    app = console_app(target, user="tester")
    app.site.listening_on(PORT)
    return app


@pytest.fixture
async def client(console: ConsoleApp) -> AsyncIterator[httpx.AsyncClient]:
    """Not logged in."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=console.asgi), base_url=ORIGIN) as client:
        yield client


@pytest.fixture
async def browser(console: ConsoleApp, client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Logged in with a login link, as a browser is after opening it."""
    response = await client.get(f"/login?token={console.auth.new_login_token()}")
    assert response.status_code == 200
    return client


@pytest.fixture(scope="module")
async def browser_process() -> AsyncIterator[Browser]:
    """Headless chromium, shared by a module's tests (each opens a context of its own)."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


async def screenshot(page: Page, name: str) -> None:
    """Save the page to `.cache/screenshots/console-<name>.png` (the test run's record of the console)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"console-{name}.png"), full_page=True)


def csrf_of(html: str) -> str:
    match = re.search(r'<meta name="csrf-token" content="([^"]+)">', html)
    assert match, "the page carries no CSRF token"
    return match.group(1)
