"""Static analysis of saved actions: which tools their code may call, from parsing alone (nothing is
imported), following the actions they use. Pure: no process is started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ipybox.codeact.analysis import MAX_SOURCE_BYTES, ActionCalls, analyse_action, analyse_source


@pytest.mark.parametrize(
    ("source", "tools"),
    [
        (
            "from mcptools.github import list_commits, search_repositories",
            ["github.list_commits", "github.search_repositories"],
        ),
        ("from mcptools.github.list_commits import Params, run", ["github.list_commits"]),
        ("import mcptools.github.list_commits as lc\nlc.run(lc.Params())", ["github.list_commits"]),
        ("import mcptools.github.list_commits", ["github.list_commits"]),
        (
            "from mcptools import github\ngithub.list_commits.run(1)\nx = github.get_issue",
            ["github.get_issue", "github.list_commits"],
        ),
        ("import mcptools.github as gh\ngh.list_commits.run()", ["github.list_commits"]),
        ("import mcptools.github\nmcptools.github.list_commits.run()", ["github.list_commits"]),
        ("import mcptools\nmcptools.github.list_commits.run()", ["github.list_commits"]),
        (
            "def f():\n    from mcptools.slack import post_message as p\n    return p.run",
            ["slack.post_message"],
        ),
        ("from mcptools.github import *", ["github.*"]),
        ("from mcptools import github", ["github.*"]),
        ("import mcptools.github as gh\ntool = getattr(gh, name)", ["github.*"]),
        ("import mcptools.github as gh\ngh.__dict__", ["github.*"]),
        ("import mcptools.github\nprint(mcptools.github)", ["github.*"]),
        ("import json\nfrom pydantic import BaseModel\nfrom typing import Any", []),
    ],
)
def test_tool_imports_are_read_as_the_tools_they_reach(source: str, tools: list[str]) -> None:
    calls = analyse_source(source)
    assert calls == ActionCalls(tools=tuple(tools))


@pytest.mark.parametrize(
    "source",
    [
        "from ipybox.tool_exec.client import ToolRunner",
        "from ipybox.tool_exec import client\nclient.ToolRunner('github').run_sync('x', {})",
        "import importlib\nimportlib.import_module('mcptools.github.x')",
        "from importlib import import_module",
        "import runpy",
        "__import__('mcptools.github')",
        "exec(code)",
        "run = eval",
        "import mcptools\nmodule = mcptools",
        "from mcptools import *",
        "import gentools\nprint(gentools)",
    ],
)
def test_calls_parsing_cannot_follow_are_dynamic(source: str) -> None:
    calls = analyse_source(source)
    assert calls.dynamic
    assert calls.summary().endswith("any tool (dynamic calls)")


@pytest.mark.parametrize(
    ("source", "actions"),
    [
        ("from gentools.github.top_repos import run", ["github.top_repos"]),
        ("from gentools.github.top_repos.api import Params", ["github.top_repos"]),
        ("import gentools.github.top_repos as top", ["github.top_repos"]),
        ("from gentools.github import top_repos", ["github.top_repos"]),
        ("from gentools import github\ngithub.top_repos.run()", ["github.top_repos"]),
        ("from gentools import github", ["github.*"]),
    ],
)
def test_saved_action_imports_are_listed_as_actions(source: str, actions: list[str]) -> None:
    assert analyse_source(source) == ActionCalls(actions=tuple(actions))


def test_relative_imports_resolve_against_the_actions_package() -> None:
    source = "from .impl import helper\nfrom . import impl\nfrom .. import sibling\nfrom ... import other\n"
    calls = analyse_source(source, module="gentools.github.top_repos.api")
    assert calls == ActionCalls(actions=("github.sibling", "other.*"))
    # Without a module name there is no package to resolve against: nothing is guessed.
    assert analyse_source(source) == ActionCalls()


def test_a_syntax_error_is_a_problem_with_its_position() -> None:
    calls = analyse_source("import json\n\ndef f(:\n    pass\n", "gentools/a/b/impl.py")
    assert calls.problems == ("gentools/a/b/impl.py:3:7: SyntaxError: invalid syntax",)
    assert calls.summary() == "no MCP tools (incomplete: 1 problem analysing its code)"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = '\0'", "impl.py:1:1: SyntaxError: source code string cannot contain null bytes"),
        ("x = " + "(" * 300 + ")" * 300, "impl.py:1:205: SyntaxError: too many nested parentheses"),
        ("x = " + "-" * 200_000 + "1", "impl.py:1:1: too deeply nested to analyse"),
        (
            "x = " + "[" * 90 + "]" * 90 + "\ny = " + "1 + " * 50_000 + "1",
            "impl.py:1:1: too deeply nested to analyse",
        ),
    ],
    ids=["null-byte", "parentheses", "unary-chain", "long-sum"],
)
def test_hostile_sources_become_problems_never_exceptions(source: str, message: str) -> None:
    assert analyse_source(source, "impl.py").problems == (message,)


@pytest.mark.parametrize(
    ("calls", "summary"),
    [
        (ActionCalls(), "no MCP tools"),
        (ActionCalls(tools=("github.list_commits", "github.search")), "github.list_commits, github.search"),
        (ActionCalls(tools=("github.*",), dynamic=True), "github.*, and any tool (dynamic calls)"),
        (ActionCalls(dynamic=True), "any tool (dynamic calls)"),
        (ActionCalls(tools=("a.b",), problems=("x", "y")), "a.b (incomplete: 2 problems analysing its code)"),
    ],
)
def test_summary_is_one_line(calls: ActionCalls, summary: str) -> None:
    assert calls.summary() == summary


# -- Saved actions on disk.


def action(gentools: Path, category: str, name: str, impl: str, api: str = "", **modules: str) -> Path:
    directory = gentools / category / name
    directory.mkdir(parents=True)
    (directory / "__init__.py").write_text("from .api import *  # noqa: F403\n")
    (directory / "api.py").write_text(
        api or 'def run() -> str:\n    """Do it."""\n    from .impl import go\n'
    )
    (directory / "impl.py").write_text(impl)
    for module, text in modules.items():
        (directory / f"{module}.py").write_text(text)
    return directory


@pytest.fixture
def gentools(tmp_path: Path) -> Path:
    return tmp_path / "gentools"


def test_an_action_lists_the_tools_of_its_impl_and_api(gentools: Path) -> None:
    action(
        gentools,
        "github",
        "top",
        "from mcptools.github import search_repositories\n",
        api="from mcptools.github.list_commits import Params as CommitParams\n\ndef run() -> str:\n    ...\n",
    )
    assert analyse_action(gentools, "github", "top") == ActionCalls(
        tools=("github.list_commits", "github.search_repositories")
    )


def test_modules_of_the_action_package_are_followed(gentools: Path) -> None:
    action(
        gentools,
        "github",
        "top",
        "from .helpers import fetch\nfrom . import formatting, run\nfrom gentools.github.top import extra\n",
        helpers="from mcptools.github import list_commits\n",
        formatting="import mcptools.slack.post_message\n",
        extra="from mcptools.time import now\n",
        unused="from mcptools.never import called\n",
    )
    calls = analyse_action(gentools, "github", "top")
    assert calls == ActionCalls(tools=("github.list_commits", "slack.post_message", "time.now"))


def test_used_actions_are_followed_and_their_calls_merged(gentools: Path) -> None:
    action(
        gentools,
        "github",
        "top",
        "from gentools.github.commits import run\nfrom mcptools.github import search\n",
    )
    action(
        gentools,
        "github",
        "commits",
        "from gentools.util import dates\nfrom mcptools.github import list_commits\n",
    )
    action(gentools, "util", "dates", "from mcptools.time import now\n")
    calls = analyse_action(gentools, "github", "top")
    assert calls == ActionCalls(
        tools=("github.list_commits", "github.search", "time.now"),
        actions=("github.commits", "util.dates"),
    )


def test_a_category_used_as_a_whole_means_each_of_its_actions(gentools: Path) -> None:
    action(gentools, "main", "everything", "from gentools import util\nfor name in dir(util):\n    pass\n")
    action(gentools, "util", "dates", "from mcptools.time import now\n")
    action(gentools, "util", "words", "from mcptools.dictionary import define\n")
    calls = analyse_action(gentools, "main", "everything")
    assert calls == ActionCalls(tools=("dictionary.define", "time.now"), actions=("util.dates", "util.words"))


def test_a_cycle_between_actions_is_a_problem_not_an_error(gentools: Path) -> None:
    action(gentools, "a", "one", "from mcptools.x import t1\nfrom gentools.a.two import run\n")
    action(gentools, "a", "two", "from mcptools.x import t2\n\nfrom gentools.a import one\n")
    calls = analyse_action(gentools, "a", "one")
    assert calls.tools == ("x.t1", "x.t2")
    assert calls.actions == ("a.two",)
    assert calls.problems == (
        "gentools/a/two/impl.py:3:1: import cycle between saved actions: a.one -> a.two -> a.one",
    )


def test_a_missing_action_is_a_problem_where_it_is_imported(gentools: Path) -> None:
    action(
        gentools,
        "a",
        "one",
        "from mcptools.x import t1\nfrom gentools.a.gone import run\nfrom gentools.list.x import y\n",
    )
    calls = analyse_action(gentools, "a", "one")
    assert calls.tools == ("x.t1",)
    assert calls.problems == (
        "gentools/a/one/impl.py:2:1: no such saved action 'a.gone' (gentools/a/gone: missing)",
        "gentools/a/one/impl.py:3:1: no such saved action 'list.x': category 'list' would shadow the "
        "Python builtin 'list'",
    )
    assert analyse_action(gentools, "nothing", "here").problems == (
        "gentools/nothing/here: no such saved action 'nothing.here' (gentools/nothing/here: missing)",
    )


def test_a_missing_impl_and_a_broken_module_are_problems(gentools: Path) -> None:
    directory = action(gentools, "a", "one", "from mcptools.x import t1\n", api="def run(:\n")
    (directory / "impl.py").unlink()
    assert analyse_action(gentools, "a", "one").problems == (
        "gentools/a/one/api.py:1:9: SyntaxError: invalid syntax",
        "gentools/a/one/impl.py:1:1: missing: an action has api.py and impl.py",
    )


def test_an_oversized_or_special_file_is_not_read(gentools: Path) -> None:
    directory = action(gentools, "a", "one", "")
    with (directory / "impl.py").open("wb") as file:
        file.write(b"from mcptools.x import t1\n")
        file.truncate(50 * 1024 * 1024)
    (directory / "api.py").unlink()
    os.mkfifo(directory / "api.py")
    calls = analyse_action(gentools, "a", "one")
    assert calls.tools == ()
    assert calls.problems == (
        "gentools/a/one/api.py:1:1: not analysed: not a regular file",
        f"gentools/a/one/impl.py:1:1: not analysed: larger than {MAX_SOURCE_BYTES} bytes",
    )


def test_symlinked_actions_and_files_are_not_followed(tmp_path: Path, gentools: Path) -> None:
    outside = action(tmp_path / "outside", "x", "y", "from mcptools.secret import read\n")
    action(gentools, "a", "one", "from gentools.a.linked import run\n")
    (gentools / "a" / "linked").symlink_to(outside)
    (gentools / "a" / "one" / "helper.py").symlink_to(outside / "impl.py")
    (gentools / "a" / "one" / "impl.py").write_text(
        "from gentools.a.linked import run\nfrom . import helper\n"
    )
    calls = analyse_action(gentools, "a", "one")
    assert calls.tools == ()
    assert calls.problems == (
        "gentools/a/one/helper.py:1:1: not analysed: a symlink (not followed)",
        "gentools/a/one/impl.py:1:1: no such saved action 'a.linked' (gentools/a/linked: a symlink, not followed)",
    )


def test_code_that_is_not_utf8_is_a_problem(gentools: Path) -> None:
    directory = action(gentools, "a", "one", "")
    (directory / "impl.py").write_bytes(b"# caf\xe9\nfrom mcptools.x import t\n")
    assert analyse_action(gentools, "a", "one").problems == (
        "gentools/a/one/impl.py:1:1: not analysed: not UTF-8 text",
    )
