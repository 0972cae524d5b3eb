"""The console in a real headless browser: Debian's chromium driven by Playwright, against a
`ConsoleEndpoint` on loopback whose board the tests open asks on (from this event loop, as the
workspace's approver does). Login, a live ask appearing and answered without a reload, answers from
elsewhere withdrawing it, the audit filters, the rules form, a foreign page's POST refused, the keys
(`y s a n d D`, `j`/`k`, `?`), desktop notifications and the sound, and every page's layout (no horizontal
overflow at 390 and 1280 px with 20 KB and 1 MB arguments) and accessibility (axe-core: no serious or
critical finding). Each page's screenshot is saved to `.cache/screenshots/console-*.png`.

The latencies printed (`-s`) are measured with the browser's own clock against this process's (same
machine): from the ask opened on the board to its card in the page, from the click to the answer reaching
the target, and from the ask opened to the desktop notification created.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, Request
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from ipybox.approval.ask_context import ClientView, cell_view
from ipybox.approval.asks import AskAnswer
from ipybox.asgi_server import EmbeddedServer
from ipybox.console.endpoint import ConsoleEndpoint
from ipybox.rules import ToolCall, Verdict
from ipybox.rules.calls import Origin
from tests.console.conftest import SCREENSHOTS, screenshot
from tests.console.targets import RULES_FILE, WorkspaceTarget

pytestmark = pytest.mark.integration

# Records, with the browser's clock, when each ask's card appears and when a button is clicked.
WATCH = """() => {
  window.__seen = {}; window.__clicks = [];
  new MutationObserver(() => {
    document.querySelectorAll('#asks .ask').forEach((card) => {
      window.__seen[card.dataset.askId] ??= Date.now();
    });
  }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('click', () => window.__clicks.push(Date.now()), true);
  window.__notReloaded = true;
}"""


class TimedTarget(WorkspaceTarget):
    """Notes when each answer reached it (ms since the epoch, the browser's clock)."""

    answered_at: list[float]

    async def answer(self, ask_id: str, answer: AskAnswer) -> str | None:
        self.answered_at.append(time.time() * 1000)
        return await super().answer(ask_id, answer)


@pytest.fixture
async def target(tmp_path: Path) -> TimedTarget:
    target = TimedTarget(tmp_path)
    target.answered_at = []
    return target


@pytest.fixture
async def console(target: TimedTarget) -> AsyncIterator[ConsoleEndpoint]:
    async with ConsoleEndpoint(target, user="tester") as console:
        yield console


@pytest.fixture
async def page(browser_process: Browser, console: ConsoleEndpoint) -> AsyncIterator[Page]:
    """A fresh browser profile, logged in with a login link, on the overview."""
    context = await browser_process.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(console.login_url())
    await page.wait_for_url(console.url or "")
    await page.wait_for_selector('#live[data-state="on"]')
    try:
        yield page
    finally:
        await context.close()


async def open_asks_page(page: Page) -> None:
    await page.click("#nav-asks")
    await page.wait_for_selector('#live[data-state="on"]')
    await page.evaluate(WATCH)


async def test_the_login_link_leads_to_the_overview_and_works_once(
    browser_process: Browser, page: Page, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    assert page.url == console.url  # the token left the address bar
    assert await page.text_content("#workspace h1") == "/home/me/project"
    assert await page.text_content('tr[data-server="broken"] td:nth-child(4)') == "ipybox.toml:12:1"
    leased = 'tr[data-role="leased"]'
    assert await page.text_content(f"{leased} td.memory") == "312 MiB"  # each kernel's RSS and CPU time
    assert await page.text_content(f"{leased} td.cpu") == "12.35 s"
    assert await page.text_content('tr[data-role="pool"] td.memory') == "52 MiB"
    assert target.board.people("console") == 1  # the open page can answer
    await screenshot(page, "overview")
    link = console.login_url()
    await page.goto(link)
    other = await browser_process.new_context()
    try:
        second = await other.new_page()
        response = await second.goto(link)  # spent by the first page
        assert response is not None and response.status == 401
        assert "ipybox console DIR" in (await second.text_content("#message") or "")
        response = await second.goto(console.url or "")
        assert response is not None and response.status == 401
    finally:
        await other.close()


async def test_a_live_ask_appears_without_a_reload_and_allow_once_answers_it(
    page: Page, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    await open_asks_page(page)
    opened_at = time.time() * 1000
    ask = target.ask(
        ToolCall(
            "filesystem",
            "write_file",
            {"path": "notes/plan.md", "content": "# Plan\n\n" + "- step\n" * 40},
            {"destructiveHint": True, "readOnlyHint": False},
        )
    )
    card = page.locator(f'[data-ask-id="{ask.id}"]')
    await card.wait_for()
    appeared_at = await page.evaluate(f"window.__seen[{ask.id!r}]")
    assert await page.text_content("#pending-count") == "1"
    await screenshot(page, "asks")
    posts: list[Request] = []
    page.on("request", lambda request: posts.append(request) if request.method == "POST" else None)
    await card.locator('[data-action="allow-once"]').click()
    note = page.locator(f'.ask-note[data-closed-ask-id="{ask.id}"]')
    await note.wait_for()
    assert await note.text_content() == "filesystem.write_file: allowed once by console (tester)"
    assert await card.count() == 0
    assert await page.evaluate("window.__notReloaded") is True
    assert target.answers == [(ask.id, AskAnswer(True, "once", "console", "console (tester)"))]
    # The page's own Origin, which the console requires (under `Referrer-Policy: no-referrer` it is "null").
    assert [(await post.all_headers()).get("origin") for post in posts] == [(console.url or "").rstrip("/")]
    clicked_at = (await page.evaluate("window.__clicks"))[-1]
    print(
        f"\nconsole latency: ask opened -> card shown {appeared_at - opened_at:.1f} ms; "
        f"click -> answer at the target {target.answered_at[-1] - clicked_at:.1f} ms"
    )


@pytest.mark.parametrize(
    ("action", "accept", "scope"), [("deny-once", False, "once"), ("deny-session", False, "session")]
)
async def test_each_button_passes_its_scope(
    page: Page, target: TimedTarget, action: str, accept: bool, scope: str
) -> None:
    await open_asks_page(page)
    ask = target.ask()
    await page.locator(f'[data-ask-id="{ask.id}"] [data-action="{action}"]').click()
    await page.locator(f'.ask-note[data-closed-ask-id="{ask.id}"]').wait_for()
    assert target.answers == [(ask.id, AskAnswer(accept, scope, "console", "console (tester)"))]  # type: ignore[arg-type]


async def test_an_ask_answered_elsewhere_or_timed_out_leaves_the_page_with_a_note(
    page: Page, target: TimedTarget
) -> None:
    await open_asks_page(page)
    answered, expired = target.ask(), target.ask(timeout=1)
    await page.locator(f'[data-ask-id="{expired.id}"]').wait_for()
    target.board.answer(
        answered.id, AskAnswer(False, "session", "terminal", "terminal (alice on /dev/pts/3)")
    )
    target.board.close(expired, why="no answer within 1 s")
    notes = page.locator(".ask-note")
    await page.locator(f'.ask-note[data-closed-ask-id="{expired.id}"]').wait_for()
    # One message at a time: the latest replaced the one before.
    assert await notes.all_text_contents() == ["filesystem.write_file: withdrawn: no answer within 1 s"]
    assert await page.locator("#asks .ask").count() == 0
    assert await page.is_visible("#no-asks")


async def test_always_opens_the_rules_preview_and_a_refused_save_is_shown_with_the_ask_kept(
    page: Page, target: TimedTarget
) -> None:
    target.config_path.write_text(RULES_FILE)
    await open_asks_page(page)
    ask = target.ask()
    target.refusal = "ipybox.toml would not load with that rule: ipybox.toml:41:1: ..."
    await page.locator(f'[data-ask-id="{ask.id}"] [data-action="allow-always"]').click()
    await page.locator("#rule-preview").wait_for()
    await page.check('input[name="arg.content"][value="any"]')
    await page.click("#narrow-submit")
    assert 'args = { path = "notes/a.md" }' in await page.inner_text("#rule-preview")
    await screenshot(page, "always-preview")
    await page.click("#save-rule")
    await page.locator(".flash").wait_for()
    assert target.answers[-1][1].choices == {"path": "exact", "content": "any"}
    assert target.refusal in await page.inner_text(".flash")
    assert await page.locator(f'[data-ask-id="{ask.id}"] [data-action="allow-once"]').is_enabled()


async def test_answering_works_without_javascript(
    browser_process: Browser, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    context = await browser_process.new_context(java_script_enabled=False)
    try:
        page = await context.new_page()
        await page.goto(console.login_url())
        await page.wait_for_url(console.url or "")  # the refresh needs no script
        await page.goto(f"{console.url}asks")
        ask = target.ask()
        await page.reload()
        await page.locator(f'[data-ask-id="{ask.id}"] [data-action="deny-once"]').click()
        await page.wait_for_url(f"{console.url}asks")
        assert await page.text_content(".flash") == "filesystem.write_file: denied once by console (tester)."
        assert target.answers == [(ask.id, AskAnswer(False, "once", "console", "console (tester)"))]
    finally:
        await context.close()


async def test_the_audit_filters_in_the_browser(page: Page, target: TimedTarget) -> None:
    for i in range(60):
        call = ToolCall("filesystem" if i % 2 else "memory", f"tool_{i}", {"i": i, "note": "<b>not bold</b>"})
        if i % 5 == 0:
            target.audit.record(
                call, Verdict("ask", "ask-for-writes", "rule 'ask-for-writes' applies"),
                answer="allow", decided_by="console", scope="session", by="console (tester)",
            )  # fmt: skip
        else:
            target.audit.record(call, Verdict("deny", "no-secrets", "rule 'no-secrets' applies"))
    await page.click("#nav-audit")
    assert await page.locator(".audit-entry").count() == 50
    await page.click("#audit-older")
    assert await page.locator(".audit-entry").count() == 10
    await page.click("#audit-newest")
    await page.fill('#audit-filters input[name="server"]', "memory")
    await page.select_option('#audit-filters select[name="decided_by"]', "console")
    await page.click("#audit-apply")
    tools = await page.locator(".audit-entry td:nth-child(2)").all_text_contents()
    assert tools == [f"memory.tool_{i}" for i in (50, 40, 30, 20, 10, 0)]
    assert await page.locator(".audit-entry td:nth-child(8)").first.text_content() == "console (tester)"
    await screenshot(page, "audit")
    await page.fill('#audit-filters input[name="since"]', "yesterday")
    await page.click("#audit-apply")
    assert "since: expected an ISO 8601 date" in (await page.text_content("#audit-error") or "")


async def test_the_rules_page_explains_a_call_and_a_shell_line(page: Page) -> None:
    await page.click("#nav-rules")
    ids = await page.locator(".rule-row").evaluate_all("rows => rows.map(r => r.dataset.ruleId)")
    assert ids == ["trusted-writes", "no-secrets", "no-rm", "ask-for-writes", "read-only", "rules[4]"]
    await page.fill("#explain-server", "filesystem")
    await page.fill("#explain-tool", "write_file")
    await page.fill("#explain-args", '{"path": "secrets/key.pem"}')
    await page.click("#explain-submit")
    verdict = page.locator("#explain-result .verdict")
    assert await verdict.get_attribute("data-rule-id") == "no-secrets"
    assert await verdict.get_attribute("data-decision") == "deny"
    await screenshot(page, "rules")
    await page.fill("#explain-server", "shell")
    await page.fill("#explain-tool", "")
    await page.fill("#explain-args", '{"cmd": "ls && rm -rf build"}')
    await page.click("#explain-submit")
    decisions = await page.locator("#explain-result .verdict").evaluate_all(
        "vs => vs.map(v => v.dataset.decision)"
    )
    assert decisions == ["allow", "deny"]
    await page.fill("#explain-args", "{cmd: ls}")
    await page.click("#explain-submit")
    assert (await page.text_content("#explain-error") or "").startswith("args: not valid JSON")


async def test_a_foreign_page_on_another_loopback_port_cannot_answer(
    browser_process: Browser, page: Page, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    # Another program's page on 127.0.0.1 is "same-site" (ports do not count), so the strict cookie goes
    # along: the Origin check and the CSRF token are what refuse it.
    ask = target.ask()

    async def evil(_: object) -> HTMLResponse:
        return HTMLResponse(
            f'<form id="f" method="post" action="{console.url}asks/{ask.id}/answer">'
            '<input name="accept" value="allow"><input name="scope" value="always"></form>'
        )

    server = EmbeddedServer(Starlette(routes=[Route("/", evil)]), "evil")
    await server.start()
    try:
        evil_page = await page.context.new_page()
        await evil_page.goto(f"http://127.0.0.1:{server.port}/")
        async with evil_page.expect_navigation():
            await evil_page.evaluate("document.getElementById('f').submit()")
        assert "another site" in (await evil_page.text_content("#message") or "")
    finally:
        await server.stop()
    assert target.answers == [] and target.board.get(ask.id) is ask


async def focused_id(page: Page) -> str | None:
    found = await page.evaluate("document.querySelector('#asks .ask.ask-focused')?.dataset.askId ?? null")
    return str(found) if found is not None else None


async def settle(page: Page) -> None:
    """Longer than console.js's SETTLE_MS: a key answers only an ask that has been focused that long."""
    await page.wait_for_timeout(550)


# The README's screenshot (docs/console.png, copied by hand from `.cache/screenshots/console-readme.png`).
REPORT = ToolCall(
    "filesystem",
    "write_file",
    {
        "path": "notes/report.md",
        "content": "# Weekly report\n\n- 14 issues closed\n- 3 releases\n\nSee notes/details.csv.\n",
    },
    {"destructiveHint": True, "idempotentHint": True, "openWorldHint": False, "readOnlyHint": False},
    cell=4,
    line=5,
    code="0" * 64,
    provenance={"content": (Origin("github", "list_issues", 2, "untrusted"),)},
)
REPORT_CELL = """from mcptools.github import list_issues
from mcptools.filesystem import write_file

issues = list_issues.run(list_issues.Params(owner="acme", repo="app", state="closed"))
write_file.run(write_file.Params(path="notes/report.md", content=weekly_report(issues)))"""
REPORT_CLIENT = ClientView.of(
    "0123456789abcdef", "Claude Code 2.1", datetime(2026, 12, 7, 9, 12, tzinfo=UTC), (6, 0), {}
)


async def test_the_keys_answer_the_focused_ask_and_never_while_typing(
    page: Page, target: TimedTarget
) -> None:
    await open_asks_page(page)
    first = target.ask(REPORT, timeout=60, cell=cell_view(REPORT, REPORT_CELL), client=REPORT_CLIENT)
    await page.locator(f'[data-ask-id="{first.id}"]').wait_for()
    await page.set_viewport_size({"width": 1280, "height": 860})
    await page.locator(f'[data-ask-id="{first.id}"] details').evaluate("d => (d.open = true)")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / "console-readme.png"))
    second = target.ask(ToolCall("memory", "create_entities", {"entities": []}))
    await page.locator(f'[data-ask-id="{second.id}"]').wait_for()
    assert await focused_id(page) == first.id  # the oldest waiting is the one the keys answer
    assert (
        await page.get_attribute(f'[data-ask-id="{first.id}"] [data-action="deny-session"]', "data-key")
        == "d"
    )
    await page.keyboard.press("j")
    assert await focused_id(page) == second.id
    assert await page.evaluate("document.activeElement.dataset.askId") == second.id
    await page.keyboard.press("k")
    await page.keyboard.press("ArrowDown")
    assert await focused_id(page) == second.id
    await page.keyboard.press("y")  # too soon after the focus moved: answers nothing
    assert await page.text_content(".ask-note") == "The ask changed: look again."
    await settle(page)
    # Typing in a field is typing: no key answers.
    await page.evaluate(
        "document.querySelector('h1').after(Object.assign(document.createElement('input'), {id: 't'}))"
    )
    await page.fill("#t", "")
    await page.type("#t", "ysandD")
    await page.locator("#t").blur()
    assert target.answers == []
    await page.keyboard.press("d")
    await page.locator(f'.ask-note[data-closed-ask-id="{second.id}"]').wait_for()
    assert target.answers == [(second.id, AskAnswer(False, "session", "console", "console (tester)"))]
    assert await focused_id(page) == first.id  # the next waiting ask takes the focus
    assert await page.locator(".ask-note").count() == 1  # each message replaces the last
    assert await page.get_attribute("#ask-notes", "aria-live") == "polite"
    await page.keyboard.press("?")
    assert await page.is_visible("#keys-help")
    await page.keyboard.press("Escape")
    assert not await page.is_visible("#keys-help")
    assert await page.evaluate("window.__notReloaded") is True
    # "Always" opens the preview of the rule it would write; nothing is answered until it is saved.
    target.config_path.write_text(RULES_FILE)
    await settle(page)
    await page.keyboard.press("a")
    await page.locator("#rule-preview").wait_for()
    assert target.answers[-1][0] == second.id
    await page.click("#save-rule")
    await page.locator(".flash").wait_for()
    assert target.answers[-1][0] == first.id
    assert (target.answers[-1][1].accept, target.answers[-1][1].scope) == (True, "always")


# Timestamps each desktop notification as it is constructed (and then constructs the real one).
HOOK_NOTIFICATION = """(() => {
  window.__notified = [];
  const Real = window.Notification;
  class Hooked extends Real {
    constructor(title, options) {
      window.__notified.push({at: Date.now(), title, body: options?.body, tag: options?.tag});
      super(title, options);
    }
  }
  window.Notification = Hooked;
  window.__tones = 0;
  const start = OscillatorNode.prototype.start;
  OscillatorNode.prototype.start = function (...args) { window.__tones += 1; return start.apply(this, args); };
})()"""


async def test_a_desktop_notification_and_a_tone_announce_an_ask_once_the_person_asked_for_them(
    browser_process: Browser, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    context = await browser_process.new_context(viewport={"width": 1280, "height": 900})
    try:
        await context.add_init_script(HOOK_NOTIFICATION)
        page = await context.new_page()
        await page.goto(console.login_url())
        await page.wait_for_url(console.url or "")
        await page.wait_for_selector('#live[data-state="on"]')
        permission = await page.evaluate("Notification.permission")
        assert permission == "default"  # never asked for on load
        target.ask()
        await page.wait_for_selector('#pending-count[data-count="1"]')
        assert await page.evaluate("window.__notified.length") == 0  # not before the person asks for them
        await context.grant_permissions(["notifications"])
        await page.click("#notify-toggle")
        await page.wait_for_selector('#notify-toggle[aria-pressed="true"]')
        assert await page.text_content("#sound-toggle") == "Sound off"  # off unless turned on
        await page.click("#sound-toggle")
        assert await page.get_attribute("#sound-toggle", "aria-pressed") == "true"
        await page.reload()  # both choices are remembered
        await page.wait_for_selector('#live[data-state="on"]')
        assert await page.get_attribute("#notify-toggle", "aria-pressed") == "true"
        assert await page.get_attribute("#sound-toggle", "aria-pressed") == "true"
        opened_at = time.time() * 1000
        ask = target.ask(ToolCall("filesystem", "write_file", {"path": "out/report.md", "content": "x"}))
        await page.wait_for_selector('#pending-count[data-count="2"]')  # counted after the notification
        notified = (await page.evaluate("window.__notified"))[0]
        assert notified["tag"] == f"ipybox-ask-{ask.id}"
        assert notified["body"].startswith("filesystem.write_file")
        assert await page.evaluate("window.__tones") == 1
        print(
            f"\nconsole latency: ask opened -> desktop notification created {notified['at'] - opened_at:.1f} ms"
        )
    finally:
        await context.close()


AXE = Path(__file__).resolve().parents[2] / ".cache" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = (390, 1280)
# WCAG 2.2 A and AA (contrast, names, labels, ARIA, keyboard) and the landmark rules; axe's other
# best-practice rules are left out: with them each page's audit took twice as long on CI's machine.
AXE_RUN = """axe.run(document, {
  resultTypes: ['violations'],
  runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa']},
  rules: {'region': {enabled: true}, 'landmark-one-main': {enabled: true}, 'page-has-heading-one': {enabled: true}},
}).then((r) => r.violations)"""


async def serious_findings(page: Page) -> list[str]:
    """axe-core's serious and critical findings on the page, one line each."""
    if not await page.evaluate("typeof axe !== 'undefined'"):
        await page.add_script_tag(path=str(AXE))
    violations = await page.evaluate(AXE_RUN)
    return [
        f"{v['id']} ({v['impact']}): {v['help']}: " + "; ".join(n["target"][0] for n in v["nodes"][:3])
        for v in violations
        if v["impact"] in ("serious", "critical")
    ]


FOCUS_SEEN = """(() => {
  const element = document.activeElement;
  if (!element || element === document.body) return null;
  const style = getComputedStyle(element);
  return {what: element.outerHTML.slice(0, 80), outlined: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2};
})()"""


async def check_at_each_width(page: Page, name: str) -> dict[str, object]:
    """The page at each of `WIDTHS` (one load: the window is resized): its screenshot saved, its serious
    accessibility findings, and its width against the window's, every folded argument opened."""
    problems: dict[str, object] = {}
    for width in WIDTHS:
        await page.evaluate("document.querySelectorAll('details').forEach((d) => (d.open = false))")
        await page.set_viewport_size({"width": width, "height": 900})
        # Folded: a full-page screenshot of a 1 MB value laid out whole takes chromium minutes.
        await screenshot(page, f"{name}-{width}")
        await page.evaluate("document.querySelectorAll('details').forEach((d) => (d.open = true))")
        if found := await serious_findings(page):
            problems[f"{name} at {width} px: axe"] = found
        page_width, window = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        if page_width > window:
            problems[f"{name} at {width} px: width"] = page_width
    # The keyboard's focus is visible on each control Tab reaches (:focus-visible's outline).
    for _ in range(4):
        await page.keyboard.press("Tab")
        focused = await page.evaluate(FOCUS_SEEN)
        if focused is not None and not focused["outlined"]:
            problems[f"{name}: no visible focus on {focused['what']}"] = focused
    return problems


@pytest.mark.slow
async def test_every_page_fits_its_width_and_has_no_serious_accessibility_finding(
    browser_process: Browser, console: ConsoleEndpoint, target: TimedTarget
) -> None:
    assert AXE.is_file(), f"{AXE} is missing: run scripts/setup (it installs tests/servers/package.json)"
    big, huge = "x" * 20_000, "y" * 1_000_000  # unbroken: the worst case for wrapping
    target.ask(ToolCall("filesystem", "write_file", {"path": "notes/" + "long-name-" * 40, "content": big}))
    target.ask(ToolCall("filesystem", "write_file", {"path": "big.bin", "content": huge}))
    for args in ({"content": big, "path": "a" * 300}, {"content": huge}):
        call = ToolCall("filesystem", "write_file", args)
        target.audit.record(call, Verdict("ask", "ask-for-writes", "rule 'ask-for-writes' applies"),
                            answer="deny", decided_by="console", scope="once", by="console (tester)")  # fmt: skip
    # The CSP allows only the console's own script: axe is injected past it, in these contexts only.
    context = await browser_process.new_context(bypass_csp=True)
    problems: dict[str, object] = {}
    try:
        page = await context.new_page()
        await page.goto(console.url or "")  # not logged in: the login page
        problems |= await check_at_each_width(page, "login")
        await page.goto(console.login_url())
        await page.wait_for_url(console.url or "")  # the login page's refresh, done before the next goto
        await page.wait_for_selector('#live[data-state="on"]')
        for name, path in (("overview", ""), ("asks", "asks"), ("audit", "audit"), ("rules", "rules")):
            await page.goto(f"{console.url}{path}")
            await page.wait_for_selector('#live[data-state="on"]')
            problems |= await check_at_each_width(page, name)
    finally:
        await context.close()
    assert problems == {}
