"""The README's walkthrough, end to end: the example workspace runs (a copy, sandboxed, its real npm and
PyPI servers), a person logs in to its console in headless chromium, and answers the `ask`s raised by a
kernel's tool calls: once (the call runs), then always (the rule lands in `ipybox.toml`, with who added it
and when, loads, and decides the next call without asking), then the audit log shows who answered.

The README's screenshot (`docs/console.png`) comes from tests/console/test_browser.py's keys test
(`.cache/screenshots/console-readme.png`, copied by hand).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page

from ipybox import CodeExecutor
from ipybox.supervisor import Supervisor
from tests.console.conftest import screenshot

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example-workspace"


def write_code(path: str, content: str) -> str:
    return (
        "from mcptools.filesystem import write_file\n"
        f"write_file.run(write_file.Params(path={path!r}, content={content!r}))\n"
        f"print(open({path!r}).read())"
    )


@pytest.fixture(scope="module")
async def supervisor(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    """A copy of the example workspace (its servers' paths made absolute), running."""
    workspace = tmp_path_factory.mktemp("example") / "example-workspace"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns(".ipybox", "mcptools", "memory.jsonl"))
    config = (workspace / "ipybox.toml").read_text()
    (workspace / "ipybox.toml").write_text(config.replace('"../.cache/', f'"{ROOT}/.cache/'))
    supervisor = Supervisor(workspace)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.stop()


@pytest.fixture
async def page(browser_process: Browser, supervisor: Supervisor) -> AsyncIterator[Page]:
    context = await browser_process.new_context(viewport={"width": 1280, "height": 860})
    page = await context.new_page()
    await page.goto(supervisor.console_login())
    await page.wait_for_selector('#live[data-state="on"]')
    try:
        yield page
    finally:
        await context.close()


async def test_a_person_answers_a_kernels_ask_once_then_always_from_the_console(
    supervisor: Supervisor, page: Page
) -> None:
    await screenshot(page, "live-overview")
    assert await page.inner_text("#workspace") != ""
    # The warm pool's kernel, as the gateway measures it (the page refreshes every 3 s while it starts).
    memory = await page.wait_for_selector('#kernels-table tr[data-role="pool"] td.memory', timeout=60_000)
    assert memory is not None and (await memory.inner_text()).endswith(" MiB")
    cpu = await page.inner_text('#kernels-table tr[data-role="pool"] td.cpu')
    assert cpu.endswith(" s") and float(cpu.removesuffix(" s")) > 0
    await page.click("#nav-asks")
    await page.wait_for_selector('#live[data-state="on"]')
    async with CodeExecutor(workspace=supervisor.workspace) as executor:
        # 1. Once: the rule "ask-for-writes" asks; the console, listed first in the example, is open.
        first = asyncio.create_task(executor.execute(write_code("out/report.md", "# Report")))
        card = await page.wait_for_selector('article.ask[data-call="filesystem.write_file"]', timeout=60_000)
        assert card is not None
        text = await card.inner_text()
        assert "ask-for-writes" in text and "out/report.md" in text
        await screenshot(page, "live-ask")
        await page.click('article.ask [data-action="allow-once"]')
        assert (await asyncio.wait_for(first, 60)).text == "# Report"
        await page.wait_for_selector(".ask-note")
        assert "allowed once by console" in await page.inner_text(".ask-note")

        # 2. Always: the rule is written into ipybox.toml and loaded; the next write is not asked.
        second = asyncio.create_task(executor.execute(write_code("out/notes.md", "notes")))
        card = await page.wait_for_selector('article.ask[data-call="filesystem.write_file"]', timeout=60_000)
        assert card is not None
        # "Always allow" opens the preview of the rule; the asking rule's condition stays, narrowing
        # nothing else by default; saving it answers the call.
        await page.click('article.ask [data-action="allow-always"]')
        preview = await page.wait_for_selector("#rule-preview")
        assert preview is not None
        assert 'args = { path = { glob = "out/**" } }' in await preview.inner_text()
        await screenshot(page, "live-always-preview")
        await page.click("#save-rule")
        assert (await asyncio.wait_for(second, 60)).text == "notes"
        config = (supervisor.workspace / "ipybox.toml").read_text()
        assert "# Added by console (" in config and "always allow filesystem.write_file" in config
        assert 'id = "always-allow-filesystem-write_file"' in config
        assert any(rule.id == "always-allow-filesystem-write_file" for rule in supervisor.policy.rules)
        third = await executor.execute(write_code("out/more.md", "more"))
        assert third.text == "more"
        assert supervisor.board.pending == []
        # Deny rules keep their priority over the new rule: outside out/ is still refused.
        refused = await executor.execute(
            "from mcptools.filesystem import write_file\n"
            "try:\n write_file.run(write_file.Params(path='hello.py', content=''))\n"
            "except Exception as e:\n print(type(e).__name__, e)"
        )
        assert "no-writes-outside-out" in (refused.text or "")

    # 3. The audit log says who answered, and how far.
    entries = [json.loads(line) for line in supervisor.paths.audit.read_text().splitlines()]
    writes = [e for e in entries if e["tool"] == "write_file"]
    assert [(e["decided_by"], e.get("scope")) for e in writes] == [
        ("console", "once"),
        ("console", "always"),
        ("rule", None),
        ("rule", None),
    ]
    assert writes[0]["by"].startswith("console (")
    await page.click("#nav-audit")
    await page.select_option('#audit-filters [name="decided_by"]', "console")
    await page.click("#audit-apply")
    await page.wait_for_selector('.audit-entry[data-tool="write_file"]')
    assert len(await page.query_selector_all(".audit-entry")) == 2
    await screenshot(page, "live-audit")
