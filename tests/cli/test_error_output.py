"""How the `ipybox` command shows a failure: an `IpyboxError` as one line, anything else as a bug in ipybox
with its traceback.

The bug cases inject an exception into a real command run in-process (there is no cheap way to make
ipybox fail from the outside, which is the point).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.cli.main import EXIT_ERROR, REPORT_BUGS, main, user_errors
from ipybox.config import ConfigError
from ipybox.config.errors import ConfigProblem
from ipybox.errors import IpyboxError
from ipybox.running.state import NotRunningError
from ipybox.sandbox import SandboxUnavailableError
from tests.cli.test_main import ipybox


def raising(error: BaseException) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise error

    return fail


@pytest.mark.integration
def test_validate_shows_a_bad_ipybox_toml_as_one_line_with_its_position(tmp_path: Path) -> None:
    (tmp_path / "ipybox.toml").write_text("[servers.fs]\ncommand = 'npx'\ncomand = 'npx'\n")
    done = ipybox("validate", str(tmp_path))
    assert done.returncode == EXIT_ERROR
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"{tmp_path / 'ipybox.toml'}:3:1: ") and "'comand'" in done.stderr


def test_an_ipybox_error_reaching_main_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = SandboxUnavailableError("bubblewrap is not installed: apt install bubblewrap")
    monkeypatch.setattr("ipybox.sandbox.doctor.run_checks", raising(error))
    assert main(["doctor"]) == EXIT_ERROR
    assert capsys.readouterr().err == "ipybox: bubblewrap is not installed: apt install bubblewrap\n"


def test_an_internal_bug_is_shown_with_its_traceback_and_where_to_report_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("ipybox.sandbox.doctor.run_checks", raising(KeyError("pool")))
    assert main(["doctor"]) == EXIT_ERROR
    lines = capsys.readouterr().err.splitlines()
    assert "bug in ipybox" in lines[0] and REPORT_BUGS in lines[0]
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "KeyError: 'pool'"  # last, so `ipybox up -d` names the exception


def test_a_value_error_from_inside_ipybox_is_a_bug_not_a_user_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "ipybox.toml").write_text("")
    monkeypatch.setattr("ipybox.config.load_config", raising(ValueError("invalid literal for int()")))
    assert main(["validate", str(tmp_path)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert (
        "bug in ipybox" in err
        and "Traceback" in err
        and err.endswith("ValueError: invalid literal for int()\n")
    )


def test_a_task_group_of_ipybox_errors_is_one_line_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = ExceptionGroup(
        "supervisor", [NotRunningError("not running"), SandboxUnavailableError("no bwrap")]
    )
    monkeypatch.setattr("ipybox.sandbox.doctor.run_checks", raising(group))
    assert main(["doctor"]) == EXIT_ERROR
    assert capsys.readouterr().err == "ipybox: not running\nipybox: no bwrap\n"


def test_a_task_group_with_one_bug_in_it_is_a_bug() -> None:
    group = ExceptionGroup(
        "supervisor", [NotRunningError("not running"), ExceptionGroup("inner", [KeyError(1)])]
    )
    assert user_errors(group) is None


def test_user_errors_flattens_nested_groups_of_ipybox_errors() -> None:
    config = ConfigError(Path("ipybox.toml"), [ConfigProblem("ipybox.toml", 1, 1, "bad")])
    inner = NotRunningError("not running")
    errors = user_errors(ExceptionGroup("outer", [config, ExceptionGroup("inner", [inner])]))
    assert errors == [config, inner]
    assert all(isinstance(error, IpyboxError) for error in errors)
