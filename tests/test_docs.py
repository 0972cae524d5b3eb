"""The documentation a newcomer reads is true: `README.md`, `CONTRIBUTING.md` and `docs/*.md`.

- Every relative link resolves: the file exists, and an `#anchor` is a heading of the target as GitHub
  slugs it (or an anchor of the same page).
- The generated pages (`docs/configuration.md` from the JSON Schemas, `docs/cli.md` from the parser) are
  what `python -m ipybox.devtools.docs` writes now.
- Every `ipybox ...` command line of a shell example parses with the real `ipybox` parser, so the docs
  show no command or flag that doesn't exist. A synopsis's optional parts (`[--force]`,
  `[--sandbox|--no-sandbox]`) are each checked too.
- Every Python example runs, except those marked `<!-- not run: reason -->` just before their block
  (a running workspace, the network or a person needed). A page's examples run in order in one process,
  as a reader would paste them one after another; pages run in parallel.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox.devtools.docs import CommandLineError, parse_command_line, stale_pages

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {ROOT / "docs" / "configuration.md", ROOT / "docs" / "cli.md"}

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    source: str
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, dedented; a `not run` marker on the line before a fence is kept."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = NOT_RUN.match(previous)
        source = textwrap.dedent("\n".join(lines[index + 1 : end]))
        found.append(Block(page, index + 1, opening["lang"], source, marker["reason"] if marker else None))
        index = end + 1
    return found


def prose(page: Path) -> str:
    """The page without its code blocks and inline code, where links and headings live."""
    text = re.sub(r"^\s*```.*?^\s*```\s*$", "", page.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (`-` and `_` kept), spaces to `-`."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^\s*```.*?^\s*```\s*$", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    result = set()
    for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        base = slug(match[1])
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(page: Path) -> list[str]:
    return re.findall(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(page))


def test_the_docs_have_the_pages_the_readme_promises() -> None:
    names = {page.name for page in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "configuration.md", "cli.md", "sandbox.md", "sdk.md"} <= names
    assert all(page.is_file() for page in PAGES)


def test_every_link_in_the_docs_resolves_to_a_file_and_heading() -> None:
    broken = []
    checked = 0
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked offline
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            checked += 1
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no heading '{anchor}' in {resolved.name}")
    assert checked > 50
    assert not broken, "\n".join(broken)


def test_a_link_checker_that_could_fail() -> None:
    assert slug("Workspaces: `ipybox up`") == "workspaces-ipybox-up"
    assert slug("Calling tools from code, with approval") == "calling-tools-from-code-with-approval"
    assert slug("`[[approval.rules]]`") == "approvalrules"
    assert slug("Sandbox (Linux; macOS untested)") == "sandbox-linux-macos-untested"


def test_the_generated_reference_pages_are_up_to_date() -> None:
    stale = [str(path.relative_to(ROOT)) for path in stale_pages()]
    assert not stale, f"out of date: {stale}: run .venv/bin/python -m ipybox.devtools.docs"


def synopsis_variants(line: str) -> list[str]:
    """A synopsis line with its optional parts: all left out, then each alternative of each put in."""
    groups = re.findall(r"\[([^\[\]]*)\]", line)
    base = re.sub(r"\s*\[[^\[\]]*\]", "", line)
    variants = [base]
    for group in groups:
        for alternative in group.split("|"):
            variants.append(re.sub(r"\s*\[[^\[\]]*\]", "", line.replace(f"[{group}]", f" {alternative} ", 1)))
    return variants


def command_lines(source: str) -> list[list[str]]:
    """The `ipybox ...` commands of a shell block, each as its argv (after `ipybox`)."""
    commands = []
    for raw in source.replace("\\\n", " ").splitlines():
        for line in synopsis_variants(raw) if re.search(r"\bipybox\b.*\[", raw) else [raw]:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.commenters = "#"
            lexer.whitespace_split = True
            try:
                tokens = list(lexer)
            except ValueError:
                continue  # not shell (output in a shell block)
            command: list[str] = []
            for token in [*tokens, ";"]:
                if token in (";", "&&", "||", "|", "&"):
                    start = next((i for i, word in enumerate(command) if not re.match(r"^\w+=", word)), 0)
                    words = command[start:]  # after the environment assignments
                    if words and (words[0] == "ipybox" or words[0].endswith("/ipybox")):
                        cut = next(
                            (i for i, word in enumerate(words) if word in ("<", ">", ">>")), len(words)
                        )
                        commands.append(words[1:cut])
                    command = []
                else:
                    command.append(token)
    return commands


def test_every_ipybox_command_line_in_the_docs_parses_with_the_real_parser() -> None:
    refused = []
    parsed = 0
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("bash", "sh", "shell", "console"):
                continue
            for argv in command_lines(block.source):
                try:
                    parse_command_line(argv)
                    parsed += 1
                except CommandLineError as e:
                    where = f"{page.relative_to(ROOT)}:{block.line}"
                    refused.append(f"{where}: ipybox {shlex.join(argv)}\n    {e}")
    assert parsed > 20
    assert not refused, "\n".join(refused)


def test_the_command_line_check_refuses_a_flag_that_does_not_exist() -> None:
    assert command_lines("ipybox server remove NAME; ipybox server list  # -w DIR\n") == [
        ["server", "remove", "NAME"],
        ["server", "list"],
    ]
    assert ["server", "add", "NAME", "--sandbox", "--", "COMMAND"] in command_lines(
        "ipybox server add NAME [--sandbox|--no-sandbox] -- COMMAND"
    )
    parse_command_line(["server", "list", "--json"])
    with pytest.raises(CommandLineError, match="--jsn"):
        parse_command_line(["server", "list", "--jsn"])


RUNNER = r"""
import ast, asyncio, json, sys, traceback

from ipybox.executor.code_executor import CodeExecutor

# No example resets its executor: a spare kernel would only cost a kernel start (CPU the suite shares).
_init = CodeExecutor.__init__
def _without_spare(self, *args, **kwargs):
    kwargs.setdefault("spare_kernel", False)
    _init(self, *args, **kwargs)
CodeExecutor.__init__ = _without_spare

blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
loop = asyncio.new_event_loop()
for block in blocks:
    try:
        code = compile(block["source"], block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            loop.run_until_complete(result)
    except BaseException:
        print(f"--- {block['where']} failed:\n{block['source']}\n", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"--- {block['where']} ran", flush=True)
"""


async def _run_page(page: Path, runnable: list[Block], tmp_path: Path) -> str | None:
    work = tmp_path / page.stem
    work.mkdir()
    servers = ROOT / ".cache" / "servers-venv" / "bin"  # mcp-server-time, as `pip install` would put it
    env = {
        **os.environ,
        "PATH": f"{servers}{os.pathsep}{os.environ.get('PATH', '')}",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PYTHONPATH": "",
    }
    blocks_json = [
        {"where": f"{page.relative_to(ROOT)}:{block.line}", "source": block.source} for block in runnable
    ]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        RUNNER,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(json.dumps(blocks_json).encode()), 240)
    if process.returncode != 0:
        return f"{page.relative_to(ROOT)}:\n{out.decode()}\n{err.decode()[-4000:]}"
    return None


@pytest.mark.integration
@pytest.mark.slow  # about a dozen executors, kernels and an MCP server, one page after another
async def test_every_python_example_in_the_docs_runs(tmp_path: Path) -> None:
    runnable: dict[Path, list[Block]] = {}
    for page in PAGES:
        if page in GENERATED:  # their examples are the models' docstrings, tested with the models
            continue
        for block in blocks(page):
            if block.lang == "python" and block.not_run is None:
                runnable.setdefault(page, []).append(block)
    assert sum(len(found) for found in runnable.values()) >= 8
    failures = await asyncio.gather(*(_run_page(page, found, tmp_path) for page, found in runnable.items()))
    failed = [failure for failure in failures if failure is not None]
    assert not failed, "\n\n".join(failed)


def test_the_examples_not_run_say_why_and_are_few() -> None:
    not_run = [block for page in PAGES for block in blocks(page) if block.not_run is not None]
    python = [
        block for page in PAGES if page not in GENERATED for block in blocks(page) if block.lang == "python"
    ]
    assert all(block.lang == "python" for block in not_run)
    assert all(len(block.not_run or "") > 10 for block in not_run)
    assert len(not_run) <= len(python) // 2 + 2, [f"{b.page.name}:{b.line}" for b in not_run]
