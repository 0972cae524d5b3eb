"""The tool search index over generated modules (written by the real generator) and saved actions
(written by hand in the layout): ranking, updates, hostile files and queries, persistence. Pure: no
process is started."""

from __future__ import annotations

import os
import sqlite3
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ipybox.codeact.index import SIGNATURE_CHARS, ToolHit, ToolIndex, fts_query
from ipybox.mcp_apigen import write_mcp_sources


def tool(
    name: str, description: str, *params: str, required: tuple[str, ...] = (), **extra: Any
) -> dict[str, Any]:
    properties = {p: {"type": "integer" if p in ("page", "per_page", "limit") else "string"} for p in params}
    schema = {"type": "object", "properties": properties, "required": list(required)}
    return {"name": name, "description": description, "input_schema": schema, **extra}


GITHUB = [
    tool(
        "list_commits",
        "List commits of a branch in a GitHub repository, newest first.",
        "owner",
        "repo",
        "sha",
        "page",
        required=("owner", "repo"),
    ),
    tool("get_commit", "Get details for a commit from a GitHub repository.", "owner", "repo", "sha"),
    tool(
        "searchRepositories",
        "Search for GitHub repositories by name, topic or language.",
        "query",
        "page",
        required=("query",),
        output_schema={"type": "object", "properties": {"total_count": {"type": "integer"}}},
    ),
    tool("create_issue", "Create a new issue in a GitHub repository.", "owner", "repo", "title", "body"),
    tool("list_issues", "List issues in a GitHub repository, with filters.", "owner", "repo", "state"),
    tool("get_file_contents", "Get the contents of a file or directory from a repository.", "owner", "path"),
    tool("create_pull_request", "Create a new pull request in a GitHub repository.", "owner", "head", "base"),
]
FILESYSTEM = [
    tool("read_text_file", "Read the complete contents of a file as text.", "path", required=("path",)),
    tool("write_file", "Create a new file or completely overwrite an existing file.", "path", "content"),
    tool("list_directory", "Get a detailed listing of all files and directories in a path.", "path"),
    tool(
        "search_files", "Recursively search for files and directories matching a pattern.", "path", "pattern"
    ),
]
SLACK = [
    tool("slack_post_message", "Post a new message to a Slack channel.", "channel_id", "text"),
    tool("slack_list_channels", "List public channels in the workspace with pagination.", "limit"),
]

ACTION_API = '''\
"""Top repositories for a topic, each with its latest commits."""

from pydantic import BaseModel, Field


class Params(BaseModel):
    topic: str
    repositories: int = 3
    since: str | None = Field(None, description="ISO date")


class Result(BaseModel):
    commits: dict[str, list[str]]


def run(params: Params) -> Result:
    """Find the most starred repositories on a topic and collect their latest commit messages."""
    from .impl import run as _run

    return _run(params)
'''


def write_action(workspace: Path, category: str, name: str, api: str = ACTION_API) -> Path:
    directory = workspace / "gentools" / category / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "__init__.py").write_text("from .api import *  # noqa: F403\n")
    (directory / "api.py").write_text(api)
    (directory / "impl.py").write_text("from mcptools.github import list_commits\n")
    return directory


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    mcptools = tmp_path / "mcptools"
    write_mcp_sources("github", GITHUB, mcptools, parsers=["list_commits"])
    write_mcp_sources("filesystem", FILESYSTEM, mcptools)
    write_mcp_sources("slack", SLACK, mcptools)
    write_action(tmp_path, "github", "commits_of_top_repos")
    return tmp_path


@pytest.fixture
def index(workspace: Path) -> Iterator[ToolIndex]:
    with ToolIndex(workspace / "mcptools") as index:
        yield index


def modules(hits: list[ToolHit]) -> list[str]:
    return [hit.module for hit in hits]


def test_a_query_for_commits_ranks_list_commits_first(index: ToolIndex) -> None:
    hits = index.search("commits")
    assert hits[0].module == "mcptools.github.list_commits"
    assert {"mcptools.github.get_commit", "gentools.github.commits_of_top_repos"} <= set(modules(hits))
    assert all(h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_a_task_description_finds_the_tools_for_it(index: ToolIndex) -> None:
    assert index.search("read a file", limit=1)[0].module == "mcptools.filesystem.read_text_file"
    assert index.search("post a message to a slack channel")[0].module == "mcptools.slack.slack_post_message"
    assert index.search("open a pull request")[0].module == "mcptools.github.create_pull_request"


def test_a_hit_carries_what_to_import_what_to_read_and_a_one_line_signature(index: ToolIndex) -> None:
    hit = index.search("list commits", limit=1)[0]
    assert hit.kind == "mcp_tool"
    assert hit.path == "mcptools/github/list_commits.py"
    assert hit.description == "List commits of a branch in a GitHub repository, newest first."
    assert hit.signature == (
        "run(Params(owner: str, repo: str, sha: str | None = ..., page: int | None = ...)) -> str; "
        "run_parsed(...) -> ParseResult"
    )
    assert "\n" not in hit.signature


def test_a_tool_with_an_output_schema_shows_its_result_model(index: ToolIndex) -> None:
    hit = index.search("search repositories", limit=1)[0]
    assert hit.module == "mcptools.github.searchrepositories"
    assert hit.signature == "run(Params(query: str, page: int | None = ...)) -> Result"


def test_camel_case_tool_names_match_their_words(index: ToolIndex) -> None:
    assert index.search("Repositories")[0].module == "mcptools.github.searchrepositories"
    assert index.search("searchRepositories")[0].module == "mcptools.github.searchrepositories"


def test_parameter_names_and_server_names_are_searchable(index: ToolIndex) -> None:
    assert index.search("channel_id", limit=1)[0].module == "mcptools.slack.slack_post_message"
    assert set(modules(index.search("slack"))) == {
        "mcptools.slack.slack_post_message",
        "mcptools.slack.slack_list_channels",
    }


def test_the_generators_boilerplate_is_not_indexed(index: ToolIndex) -> None:
    assert index.search("generated edit") == []


def test_a_saved_action_is_found_by_its_docstring_and_parameters(index: ToolIndex) -> None:
    hits = index.search("starred topic")
    assert hits[0] == ToolHit(
        kind="code_action",
        module="gentools.github.commits_of_top_repos",
        path="gentools/github/commits_of_top_repos/api.py",
        signature="run(Params(topic: str, repositories: int = ..., since: str | None = ...)) -> Result",
        description="Find the most starred repositories on a topic and collect their latest commit messages.",
        score=hits[0].score,
    )
    assert index.search("github__commits_of_top_repos")[0].module == "gentools.github.commits_of_top_repos"


def test_an_action_without_params_and_an_async_one_show_their_signatures(
    workspace: Path, index: ToolIndex
) -> None:
    write_action(
        workspace, "misc", "today", 'import datetime\n\ndef run() -> str:\n    """Today\'s date."""\n'
    )
    write_action(
        workspace, "misc", "later", 'async def run(days: int) -> "Later":\n    """A later date."""\n'
    )
    assert index.search("today")[0].signature == "run() -> str"
    assert index.search("later date")[0].signature == "async run(days: int) -> Later"


@pytest.mark.parametrize(
    "query",
    [
        '"foo',
        "NEAR(",
        "*",
        "a OR",
        "AND",
        "NOT x",
        "-",
        "col:x",
        "^",
        "'",
        "(",
        ")",
        '"""',
        "a*b",
        "\0",
        "{x y}",
    ],
)
def test_query_syntax_is_never_passed_to_fts5(index: ToolIndex, query: str) -> None:
    index.search(query)  # does not raise
    assert fts_query(query).count('"') % 2 == 0


def test_a_query_with_fts5_operators_matches_them_as_words(index: ToolIndex) -> None:
    assert index.search("issue NOT create")[0].module in {
        "mcptools.github.create_issue",
        "mcptools.github.list_issues",
    }
    assert fts_query('NEAR("commits"') == '"NEAR" OR "NEAR"* OR "commits" OR "commits"*'


def test_a_query_without_words_finds_nothing(index: ToolIndex) -> None:
    assert index.search("") == []
    assert index.search("  ?! -- ") == []
    assert index.search("___") == []


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3"])
def test_a_bad_limit_is_a_clear_error(index: ToolIndex, limit: Any) -> None:
    with pytest.raises(ValueError, match="limit must be a positive whole number"):
        index.search("commits", limit=limit)


def test_limit_caps_the_number_of_hits(index: ToolIndex) -> None:
    assert len(index.search("github repository", limit=2)) == 2
    assert len(index.search("github repository", limit=100)) > 2


def test_sync_parses_only_what_changed(workspace: Path, index: ToolIndex) -> None:
    assert index.sync() == 14  # 13 tools, 1 action
    assert index.sync() == 0
    write_mcp_sources("slack", SLACK, workspace / "mcptools")  # regenerated, unchanged: new files
    assert index.sync() == 2
    assert index.sync() == 0


def test_regenerating_a_server_updates_its_entries(workspace: Path, index: ToolIndex) -> None:
    assert "mcptools.slack.slack_list_channels" in modules(index.search("channels"))
    renamed = [
        tool("slack_list_conversations", "List public conversations in the workspace.", "cursor"),
        SLACK[0],
    ]
    write_mcp_sources("slack", renamed, workspace / "mcptools")
    assert "mcptools.slack.slack_list_channels" not in modules(index.search("channels"))
    assert index.search("conversations")[0].module == "mcptools.slack.slack_list_conversations"


def test_a_removed_server_and_a_removed_action_disappear(workspace: Path, index: ToolIndex) -> None:
    assert index.search("slack") and index.search("starred")
    for path in (workspace / "mcptools" / "slack").iterdir():
        path.unlink()
    (workspace / "mcptools" / "slack").rmdir()
    (workspace / "gentools" / "github" / "commits_of_top_repos" / "api.py").unlink()
    assert index.sync() == 3
    assert index.search("slack") == []
    assert index.search("starred") == []


def test_a_new_action_is_found_once_it_is_saved(workspace: Path, index: ToolIndex) -> None:
    assert index.search("weather") == []
    write_action(
        workspace,
        "weather",
        "forecast",
        "from pydantic import BaseModel\n\nclass Params(BaseModel):\n    city: str\n\n"
        'def run(params: Params) -> str:\n    """Weather forecast for a city."""\n',
    )
    hit = index.search("weather", limit=1)[0]
    assert (hit.module, hit.signature) == ("gentools.weather.forecast", "run(Params(city: str)) -> str")


def test_staging_directories_are_not_indexed(workspace: Path, index: ToolIndex) -> None:
    staging = workspace / "mcptools" / ".slack.tmp-abc"
    staging.mkdir()
    (staging / "slack_post_message.py").write_bytes(
        (workspace / "mcptools/slack/slack_post_message.py").read_bytes()
    )
    write_action(workspace, "github", ".staged-1234")
    write_action(workspace, ".cat", "name")
    paths = [h.path for h in index.search("slack message starred", limit=100)]
    assert paths.count("mcptools/slack/slack_post_message.py") == 1
    assert paths.count("gentools/github/commits_of_top_repos/api.py") == 1
    assert not [p for p in paths if "/." in p or p.startswith(".")]


def test_a_module_that_does_not_parse_is_skipped_and_the_rest_indexed(
    workspace: Path, index: ToolIndex
) -> None:
    (workspace / "mcptools" / "github" / "broken.py").write_text('"""Broken commits tool."""\ndef run(:\n')
    (workspace / "mcptools" / "github" / "nulls.py").write_bytes(b'"""Null commits."""\n\0\n')
    (workspace / "mcptools" / "github" / "latin1.py").write_bytes(
        '"""Caf\xe9 commits."""\n'.encode("latin-1")
    )
    (workspace / "mcptools" / "github" / "deep.py").write_text(
        '"""Deep commits."""\nx = ' + "-" * 200_000 + "1\n"
    )
    (workspace / "mcptools" / "github" / "no_run.py").write_text('"""No run, still about commits."""\n')
    write_action(workspace, "bad", "action", "def run(:\n")
    hits = modules(index.search("commits"))
    assert hits[0] == "mcptools.github.list_commits"
    assert not {"broken", "nulls", "latin1", "deep", "no_run"} & {m.rsplit(".", 1)[1] for m in hits}


def test_a_50_mb_module_is_skipped(workspace: Path, index: ToolIndex) -> None:
    huge = workspace / "mcptools" / "github" / "huge.py"
    with huge.open("wb") as file:
        file.write(b'"""Huge commits tool."""\ndef run(params: Params) -> str:\n    ...\n')
        file.truncate(50 * 1024 * 1024)
    assert "mcptools.github.huge" not in modules(index.search("huge commits"))
    assert index.sync() == 0  # recorded as seen: not looked at again until it changes


def test_a_symlinked_server_action_or_module_is_not_followed(
    tmp_path: Path, workspace: Path, index: ToolIndex
) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    write_mcp_sources("secret", [tool("exfiltrate", "Secret exfiltrate tool.")], outside / "mcptools")
    write_action(outside, "secret", "exfiltrate_action")
    (workspace / "mcptools" / "linked").symlink_to(outside / "mcptools" / "secret")
    (workspace / "gentools" / "linked").symlink_to(outside / "gentools" / "secret")
    (workspace / "gentools" / "github" / "linked").symlink_to(
        outside / "gentools" / "secret" / "exfiltrate_action"
    )
    (workspace / "mcptools" / "github" / "linked.py").symlink_to(
        outside / "mcptools" / "secret" / "exfiltrate.py"
    )
    fifo = workspace / "mcptools" / "github" / "fifo.py"
    os.mkfifo(fifo)
    assert index.search("exfiltrate secret starred") == index.search("starred")


def test_a_symlinked_mcptools_directory_is_not_followed(tmp_path: Path, workspace: Path) -> None:
    linked = tmp_path / "linked-workspace"
    linked.mkdir()
    (linked / "mcptools").symlink_to(workspace / "mcptools")
    with ToolIndex(linked / "mcptools") as index:
        assert index.search("commits") == []


def test_unicode_names_and_text_are_indexed_and_stored(workspace: Path, index: ToolIndex) -> None:
    server = workspace / "mcptools" / "café"
    server.mkdir()
    (server / "crème.py").write_text(
        '"""Réserver une table au café. \\udcff"""\nTOOL_NAME = "réserver\\udcff\\x00"\n'
        "def run(params: Params) -> str:\n    ...\n"
    )
    write_mcp_sources(
        "intl", [tool("naïve_tool", "Übersetze einen Text ins Deutsche.", "sprache")], workspace / "mcptools"
    )
    hit = index.search("reserver cafe", limit=1)[0]
    assert (hit.module, hit.path) == ("mcptools.café.crème", "mcptools/café/crème.py")
    assert index.search("übersetze", limit=1)[0].module.startswith("mcptools.intl.")
    assert index.search("ubersetze", limit=1)[0].module.startswith("mcptools.intl.")


def test_a_long_signature_is_cut_to_one_short_line(workspace: Path, index: ToolIndex) -> None:
    params = [f"parameter_number_{i}" for i in range(40)]
    write_mcp_sources(
        "wide", [tool("wide_tool", "A tool with many parameters.", *params)], workspace / "mcptools"
    )
    signature = index.search("wide_tool", limit=1)[0].signature
    assert signature.startswith("run(Params(parameter_number_0: str | None = ..., ")
    assert signature.endswith(", ...)) -> str")
    assert len(signature) <= SIGNATURE_CHARS + 20


def test_the_index_persists_across_instances(workspace: Path, tmp_path: Path) -> None:
    db = tmp_path / "state" / "tools.db"
    db.parent.mkdir()
    with ToolIndex(workspace / "mcptools", db) as first:
        assert first.sync() == 14
        expected = first.search("commits")
    with ToolIndex(workspace / "mcptools", db) as second:
        assert second.sync() == 0
        assert second.search("commits") == expected
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_two_indexes_on_one_file_see_each_others_work(workspace: Path, tmp_path: Path) -> None:
    db = tmp_path / "tools.db"
    with ToolIndex(workspace / "mcptools", db) as first, ToolIndex(workspace / "mcptools", db) as second:
        assert first.sync() == 14
        assert second.sync() == 0
        write_action(workspace, "misc", "weather", 'def run() -> str:\n    """Weather today."""\n')
        assert modules(second.search("weather")) == ["gentools.misc.weather"]
        assert first.sync() == 0
        assert modules(first.search("weather")) == ["gentools.misc.weather"]


@pytest.mark.parametrize(
    "content",
    [b"this is not a database at all" * 100, b"SQLite format 3\0" + b"\xff" * 4080, b""],
    ids=["garbage", "bad-header", "empty"],
)
def test_a_corrupt_db_file_is_rebuilt(workspace: Path, tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "tools.db"
    db.write_bytes(content)
    with ToolIndex(workspace / "mcptools", db) as index:
        assert index.search("commits")[0].module == "mcptools.github.list_commits"


def test_a_foreign_sqlite_db_is_rebuilt(workspace: Path, tmp_path: Path) -> None:
    db = tmp_path / "tools.db"
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE files (name TEXT)")
        other.execute("INSERT INTO files VALUES ('x')")
    other.close()
    with ToolIndex(workspace / "mcptools", db) as index:
        assert index.search("commits")[0].module == "mcptools.github.list_commits"


def test_a_db_broken_while_open_is_rebuilt(workspace: Path, tmp_path: Path) -> None:
    db = tmp_path / "tools.db"
    with ToolIndex(workspace / "mcptools", db) as index:
        assert index.sync() == 14
        vandal = sqlite3.connect(db)
        vandal.execute("DROP TABLE entries")
        vandal.close()
        assert index.search("commits")[0].module == "mcptools.github.list_commits"


def test_an_index_of_another_mcptools_directory_starts_over(workspace: Path, tmp_path: Path) -> None:
    db = tmp_path / "tools.db"
    other = tmp_path / "other" / "mcptools"
    write_mcp_sources("other", [tool("other_tool", "Another tool.")], other)
    with ToolIndex(other, db) as index:
        assert modules(index.search("another")) == ["mcptools.other.other_tool"]
    with ToolIndex(workspace / "mcptools", db) as index:
        assert index.search("another") == []
        assert index.search("commits")[0].module == "mcptools.github.list_commits"


def test_close_is_idempotent_and_a_closed_index_says_so(workspace: Path) -> None:
    index = ToolIndex(workspace / "mcptools")
    index.close()
    index.close()
    with pytest.raises(ValueError, match="closed"):
        index.search("commits")


def test_searches_from_many_threads_share_one_index(workspace: Path, tmp_path: Path) -> None:
    with ToolIndex(workspace / "mcptools", tmp_path / "tools.db") as index:
        queries = ["commits", "file", "slack message", "issue", "pull request"] * 10
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda q: index.search(q)[0].module, queries))
    assert results[:5] == [
        "mcptools.github.list_commits",
        results[1],
        "mcptools.slack.slack_post_message",
        results[3],
        "mcptools.github.create_pull_request",
    ]
    assert results == results[:5] * 10


def test_a_missing_workspace_indexes_nothing(tmp_path: Path) -> None:
    with ToolIndex(tmp_path / "nowhere" / "mcptools") as index:
        assert index.sync() == 0
        assert index.search("commits") == []


def test_fts_query_quotes_every_word_and_adds_prefix_terms() -> None:
    assert fts_query("list_commits of ab") == ('"list" OR "list"* OR "commits" OR "commits"* OR "of" OR "ab"')
    assert fts_query("searchRepositories") == (
        '"searchRepositories" OR "searchRepositories"* OR "search" OR "search"* OR "Repositories" OR "Repositories"*'
    )
    assert fts_query(" ".join(f"w{i}xx" for i in range(100))).count(" OR ") == 63


def test_a_hit_describes_a_tool_by_the_first_line_of_its_description(
    index: ToolIndex, workspace: Path
) -> None:
    # Descriptions spanning paragraphs keep the first line as the hit's description.
    long = textwrap.dedent(
        """\
        Fetch a URL.

        Long explanation of fetching, caching and redirects."""
    )
    write_mcp_sources("web", [tool("fetch", long, "url")], workspace / "mcptools")
    hit = index.search("redirects", limit=1)[0]
    assert (hit.module, hit.description) == ("mcptools.web.fetch", "Fetch a URL.")
