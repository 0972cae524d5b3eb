"""A person answering an `ask` at the web console of a running workspace (in-process Supervisor, sandbox
on, `[approval] ask = ["console"]`), in headless chromium (Debian's, driven by Playwright):

- `console.ask_shown`: from the kernel's tool call (the time the cell took just before calling) to the
  ask's card in the page (the browser's clock, by a MutationObserver): tool server, rules, the board, the
  SSE event, and the card fetched and drawn.
- `console.click_to_run`: from the click on "Allow once" (the browser's clock) to the call having run in
  the kernel (the cell's clock right after the call returned): the form's POST, the answer, the tool
  server running the call and answering the kernel.

Both clocks are the same machine's wall clock.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from _protocol import emit, log, parse_args
from playwright.async_api import async_playwright

from ipybox import CodeExecutor
from ipybox.supervisor import Supervisor

EDGE = Path(__file__).resolve().parents[2] / "tests" / "servers" / "edge_server.py"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WATCH = """() => {
  window.__seen = {}; window.__clicks = [];
  new MutationObserver(() => {
    document.querySelectorAll('#asks .ask').forEach((card) => {
      window.__seen[card.dataset.askId] ??= Date.now();
    });
  }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('click', () => window.__clicks.push(Date.now()), true);
}"""
CODE = (
    "import time\nfrom mcptools.edge import echo\n"
    "_t0 = time.time()\necho.run(echo.Params(text='hi'))\n_t1 = time.time()\nprint(_t0 * 1000, _t1 * 1000)"
)


async def main() -> None:
    args = parse_args(__doc__ or "", default_runs=20, default_warmup=2)
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        workspace = Path(tmp)
        (workspace / "ipybox.toml").write_text(
            "[kernel]\nwarm_pool = 1\n[sandbox]\nenabled = true\n"
            f'[servers.edge]\ncommand = "{sys.executable}"\nargs = ["{EDGE}"]\n'
            '[approval]\ndefault = "ask"\nask = ["console"]\n'
        )
        supervisor = Supervisor(workspace)
        await supervisor.start()
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
                )
                page = await browser.new_page()
                await page.goto(supervisor.console_login())
                await page.click("#nav-asks")
                await page.wait_for_selector('#live[data-state="on"]')
                await page.evaluate(WATCH)
                shown: list[float] = []
                to_run: list[float] = []
                async with CodeExecutor(workspace=workspace) as executor:
                    for i in range(args.warmup + args.runs):
                        cell = asyncio.create_task(executor.execute(CODE))
                        card = await page.wait_for_selector("article.ask", timeout=30_000)
                        assert card is not None
                        ask_id = await card.get_attribute("data-ask-id")
                        await page.click("article.ask [data-action='allow-once']")
                        t0, t1 = map(float, ((await cell).text or "").split())
                        seen = await page.evaluate(f"window.__seen[{ask_id!r}]")
                        click = await page.evaluate("window.__clicks[window.__clicks.length - 1]")
                        if i >= args.warmup:
                            shown.append(seen - t0)
                            to_run.append(t1 - click)
                        await page.wait_for_selector("article.ask", state="detached")
                await browser.close()
            log(f"shown {[round(s, 1) for s in shown]}, click->run {[round(r, 1) for r in to_run]}")
            emit("console.ask_shown", shown)
            emit("console.click_to_run", to_run)
        finally:
            await supervisor.stop()


if __name__ == "__main__":
    asyncio.run(main())
