"""`server_outcome` without processes: a server's state after an apply, and which configuration problems
are a server's, decided by where they are in `ipybox.toml`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.config import CONFIG_FILE, ConfigError, load_config
from ipybox.running.status import MCPServerStatus, ReconcilerStatus
from ipybox.supervisor.outcome import problems_about, server_outcome


def load_error(directory: Path, text: str) -> tuple[ConfigError, str]:
    path = directory / CONFIG_FILE
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    return raised.value, text


def test_a_ready_server_reports_its_generation_and_tools() -> None:
    status = ReconcilerStatus(servers={"fs": MCPServerStatus(state="ready", tools=3, generation=7)})
    outcome = server_outcome("fs", status, None, None)
    assert (outcome.state, outcome.generation, outcome.tools, outcome.error) == ("ready", 7, 3, None)


def test_a_failed_server_reports_why_and_the_package_that_stays() -> None:
    failed = MCPServerStatus(state="failed", tools=3, generation=7, error="exited with code 1")
    outcome = server_outcome("fs", ReconcilerStatus(servers={"fs": failed}), None, None)
    assert (outcome.state, outcome.generation, outcome.error) == ("failed", 7, "exited with code 1")


def test_a_server_the_configuration_does_not_enable_is_absent() -> None:
    outcome = server_outcome("fs", ReconcilerStatus(), None, None)
    assert (
        outcome.state == "absent" and outcome.error == "no enabled server 'fs' in the configuration that runs"
    )


def test_a_problem_is_the_servers_whose_table_it_is_in_not_the_one_its_text_names(tmp_path: Path) -> None:
    error, text = load_error(
        tmp_path,
        '[servers.refs]\ncommand = "x"\ncomand = "typo"\n\n[servers.fs]\ncommand = "y"\n',
    )
    assert [p.line for p in problems_about("refs", error, text)] == [3]
    assert problems_about("fs", error, text) == []
    fs = server_outcome("fs", ReconcilerStatus(), error, text)
    assert fs.state == "config_error" and not fs.about_server and len(fs.problems) == 1


def test_a_problem_of_an_inline_server_table_is_located_too(tmp_path: Path) -> None:
    error, text = load_error(
        tmp_path, '[servers]\nfs = { command = "x", url = "http://y" }\nrefs = { command = "z" }\n'
    )
    assert [p.line for p in problems_about("fs", error, text)] == [2]
    assert problems_about("refs", error, text) == []


def test_a_problem_outside_every_server_belongs_to_none(tmp_path: Path) -> None:
    error, text = load_error(tmp_path, '[kernel]\nwarm_pool = "many"\n\n[servers.fs]\ncommand = "x"\n')
    assert problems_about("fs", error, text) == []
    outcome = server_outcome("fs", ReconcilerStatus(), error, text)
    assert outcome.error is not None and "warm_pool" in outcome.error


def test_without_the_files_text_no_problem_is_placed(tmp_path: Path) -> None:
    error, _ = load_error(tmp_path, '[servers.fs]\ncomand = "x"\n')
    assert problems_about("fs", error, None) == []
