"""`[secrets.<name>]`: resolved on the host from a `${VAR}` or a command, handed to kernels as an unguessable
placeholder, and never shown: not by `repr`, not in an error, not from a command's output. A workspace that
could not deliver a secret (its kernels unsandboxed, its host out of reach, its variable taken) does not
load, and the error is placed at the key to change."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ipybox.config import ConfigError, load_config
from ipybox.config.schema import workspace_schema
from ipybox.config.secrets import (
    PLACEHOLDER_PATTERN,
    ResolvedSecret,
    SecretError,
    SecretSection,
    kernel_env,
    resolve_secrets,
    secret_values,
)
from ipybox.errors import IpyboxError
from ipybox.process import is_alive
from tests.config.conftest import ROOT

WriteConfig = Callable[[str], Path]

VALUE = "s3cret-value"
GITHUB = {"env": "GITHUB_TOKEN", "hosts": ["api.github.com"]}


def section(**keys: Any) -> SecretSection:
    return SecretSection.model_validate({**GITHUB, **keys})


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def resolve_one(
    secret: SecretSection, environ: dict[str, str] | None = None, dotenv: Path | None = None
) -> ResolvedSecret:
    return resolve_secrets({"github": secret}, environ=environ or {}, dotenv_path=dotenv)["github"]


def resolve_error(secret: SecretSection, environ: dict[str, str] | None = None) -> SecretError:
    with pytest.raises(SecretError) as caught:
        resolve_one(secret, environ)
    return caught.value


# Resolving on the host.


def test_a_variable_secret_resolves_from_the_environment() -> None:
    resolved = resolve_one(section(value="${GH_PAT}"), {"GH_PAT": VALUE})
    assert resolved.value == VALUE and resolved.env == "GITHUB_TOKEN"


def test_a_variable_secret_resolves_from_dotenv_when_the_environment_lacks_it(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"GH_PAT={VALUE}\n")
    assert resolve_one(section(value="${GH_PAT}"), {}, dotenv).value == VALUE
    assert resolve_one(section(value="${GH_PAT}"), {"GH_PAT": "from-the-environment"}, dotenv).value == (
        "from-the-environment"
    )


def test_an_unset_variable_is_an_error_naming_the_secret_and_the_variable(tmp_path: Path) -> None:
    error = resolve_error(section(value="${GH_PAT}"))
    assert "secret 'github'" in str(error) and "GH_PAT is not set" in str(error)
    assert isinstance(error, IpyboxError) and isinstance(error, ValueError)


def test_a_command_secret_is_its_stripped_output() -> None:
    resolved = resolve_one(section(command=python("print('  s3cret-value  ')")))
    assert resolved.value == VALUE


def test_a_command_runs_with_the_given_environment_and_finds_its_program_on_its_path() -> None:
    program = Path(sys.executable)
    environ = {"PATH": str(program.parent), "THE_SECRET": VALUE}
    code = "import os; print(os.environ['THE_SECRET'])"
    assert resolve_one(section(command=[program.name, "-c", code]), environ).value == VALUE


def test_a_failing_command_names_the_secret_and_its_stderr_first_line_never_its_stdout() -> None:
    code = (
        "import sys; print('partial-s3cret-value'); "
        "sys.stderr.write('\\nError: api/github is not in the password store.\\nhint: pass init\\n'); "
        "sys.exit(3)"
    )
    error = resolve_error(section(command=python(code)))
    message = str(error)
    assert "secret 'github'" in message and "exited with status 3" in message
    assert "Error: api/github is not in the password store." in message
    assert "hint" not in message and "partial-s3cret-value" not in message and "\n" not in message


def test_what_stdout_printed_is_redacted_from_the_quoted_stderr_line() -> None:
    code = "import sys; print('s3cret-value'); sys.exit('cannot use s3cret-value here')"
    message = str(resolve_error(section(command=python(code))))
    assert VALUE not in message and "cannot use [redacted] here" in message


def test_a_long_stderr_line_is_clipped() -> None:
    message = str(resolve_error(section(command=python("import sys; sys.exit('x' * 1000)"))))
    assert "x" * 197 + "..." in message and "x" * 201 not in message


def test_a_command_that_does_not_finish_in_time_is_killed_and_an_error() -> None:
    started = time.monotonic()
    error = resolve_error(section(command=python("import time; time.sleep(60)"), timeout=0.5))
    assert time.monotonic() - started < 10
    assert "secret 'github'" in str(error) and "did not finish within 0.5 s" in str(error)


def test_a_missing_program_is_an_error_saying_so() -> None:
    error = resolve_error(section(command=["ipybox-no-such-program", "show"]), {"PATH": "/nonexistent"})
    assert "'ipybox-no-such-program' is not found on PATH" in str(error)
    error = resolve_error(section(command=["/nonexistent/pass"]))
    assert "'/nonexistent/pass' does not exist or is not executable" in str(error)


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        ("print('   ')", "gave an empty value"),
        ("print('line one\\nline two')", "contains a line break or NUL"),
        ("print('a\\rb')", "contains a line break or NUL"),
        ("print('a\\0b')", "contains a line break or NUL"),
        ("import sys; sys.stdout.buffer.write(b'\\xff\\xfe')", "not UTF-8 text"),
    ],
    ids=["empty", "lf", "cr", "nul", "not-utf8"],
)
def test_a_value_that_cannot_go_in_a_header_is_an_error(code: str, problem: str) -> None:
    assert problem in str(resolve_error(section(command=python(code))))


def test_an_empty_variable_is_an_error() -> None:
    assert "gave an empty value" in str(resolve_error(section(value="${GH_PAT}"), {"GH_PAT": ""}))


# What kernels see.


def test_the_placeholder_is_unguessable_and_carries_the_name() -> None:
    secret = section(value="${GH_PAT}")
    first, second = (resolve_one(secret, {"GH_PAT": VALUE}) for _ in range(2))
    assert first.placeholder != second.placeholder
    assert first.placeholder.startswith("ipybox-secret-github-") and VALUE not in first.placeholder
    match = PLACEHOLDER_PATTERN.fullmatch(first.placeholder)
    assert match is not None and match["name"] == "github"


def test_kernels_get_the_placeholder_and_the_audit_log_the_value() -> None:
    sections = {
        "github": section(value="${GH_PAT}"),
        "openai": SecretSection.model_validate(
            {"value": "${OPENAI}", "env": "OPENAI_API_KEY", "hosts": ["api.openai.com"]}
        ),
    }
    resolved = resolve_secrets(sections, environ={"GH_PAT": VALUE, "OPENAI": "sk-other"}, dotenv_path=None)
    env = kernel_env(resolved)
    assert env == {
        "GITHUB_TOKEN": resolved["github"].placeholder,
        "OPENAI_API_KEY": resolved["openai"].placeholder,
    }
    assert VALUE not in str(env)
    assert sorted(secret_values(resolved)) == sorted([VALUE, "sk-other"])


def test_hosts_and_headers_are_normalized_for_the_proxy() -> None:
    secret = section(
        value="${GH_PAT}", hosts=["API.GitHub.com.", "*.githubusercontent.com"], headers=["Authorization"]
    )
    resolved = resolve_one(secret, {"GH_PAT": VALUE})
    assert resolved.hosts == ("api.github.com", "*.githubusercontent.com")
    assert resolved.headers == frozenset({"authorization"})
    assert resolve_one(section(value="${GH_PAT}"), {"GH_PAT": VALUE}).headers is None


def test_neither_repr_nor_an_error_shows_the_value() -> None:
    resolved = resolve_one(section(value="${GH_PAT}"), {"GH_PAT": VALUE})
    assert VALUE not in repr(resolved) and VALUE not in str(resolved)
    assert resolved.placeholder in repr(resolved)
    error = resolve_error(section(command=python(f"print({VALUE!r}); raise SystemExit(1)")))
    assert VALUE not in repr(error) and VALUE not in str(error)


@pytest.mark.parametrize(
    "code",
    [
        f"import sys, time; print({VALUE!r}, flush=True); time.sleep(60)",
        f"import sys; sys.stdout.buffer.write({VALUE.encode()!r} + b'\\xff')",
    ],
    ids=["timeout", "not-utf8"],
)
def test_an_error_does_not_chain_the_exception_that_held_the_output(code: str) -> None:
    # `TimeoutExpired` holds what was printed so far, `UnicodeDecodeError` all of it: a traceback printer
    # or error reporter walking `__context__` would find the value there.
    error = resolve_error(section(command=python(code), timeout=0.5))
    assert error.__context__ is None and error.__cause__ is None


def test_a_dotenv_that_is_not_utf8_is_an_error_without_its_bytes(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_bytes(b"OTHER=" + VALUE.encode() + b"\xff\nGH_PAT=x\n")
    with pytest.raises(SecretError) as caught:
        resolve_one(section(value="${GH_PAT}"), {}, dotenv)
    assert "is not UTF-8 text" in str(caught.value) and caught.value.__context__ is None


# The table.


def test_a_literal_value_is_refused() -> None:
    with pytest.raises(
        ValidationError, match=r'put it in .env or the environment and write value = "\$\{NAME\}"'
    ):
        section(value=VALUE)


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"value": "${A}", "command": ["pass"]}, "either 'value'"),
        ({}, "a secret needs 'value'"),
        ({"value": "${A}", "timeout": 5}, "timeout is how long 'command' may run"),
        ({"command": ["pass"], "timeout": 0}, "greater than 0"),
        ({"command": ["pass"], "timeout": True}, "not true"),
        ({"command": []}, "command is a program and its arguments"),
        ({"command": ["bin/pass"]}, "is a relative path"),
        ({"value": "${A-B}"}, "invalid placeholder ${A-B}"),
        ({"value": "${A}", "env": "GITHUB-TOKEN"}, "is not an environment variable name"),
        ({"value": "${A}", "env": "IPYBOX_TOOL_TOKEN"}, "set by ipybox in every kernel"),
        ({"value": "${A}", "env": "https_proxy"}, "set by ipybox in every kernel"),
        ({"value": "${A}", "hosts": []}, "a secret sent nowhere"),
        ({"value": "${A}", "hosts": ["https://api.github.com"]}, "without scheme"),
        ({"value": "${A}", "headers": []}, "leave headers out for any header"),
        ({"value": "${A}", "headers": ["Bad Header"]}, "not an HTTP header name"),
    ],
)
def test_a_table_that_cannot_be_a_secret_is_refused(keys: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem.replace("$", r"\$").replace("{", r"\{")):
        section(**keys)


def test_the_example_mentions_every_key_of_a_secret() -> None:
    # tests/config/test_schema.py checks the other tables; the secret's keys are written in its example.
    text = (ROOT / "ipybox.toml.example").read_text()
    example = text[text.index("# [secrets.github]") :]
    keys = workspace_schema()["$defs"]["SecretSection"]["properties"]
    assert [key for key in keys if f"{key} = " not in example] == []


# Loading a workspace: what [secrets] needs of the other tables.

NETWORK = '[sandbox.network]\nallowedDomains = ["*.github.com"]\n'
SECRET = '[secrets.github]\nvalue = "${GITHUB_PAT}"\nenv = "GITHUB_TOKEN"\nhosts = ["api.github.com"]\n'


def load_error(write_config: WriteConfig, text: str) -> str:
    path = write_config(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert len(caught.value.problems) == 1
    return str(caught.value).removeprefix(str(path))


def test_a_workspace_with_a_secret_loads_without_resolving_it(write_config: WriteConfig) -> None:
    config = load_config(write_config(NETWORK + SECRET))  # GITHUB_PAT is set nowhere: resolved at start
    assert (
        config.secrets["github"].value == "${GITHUB_PAT}" and config.secrets["github"].env == "GITHUB_TOKEN"
    )


def test_a_secret_variable_also_in_kernel_env_is_refused_at_its_env(write_config: WriteConfig) -> None:
    error = load_error(write_config, '[kernel]\nenv = { GITHUB_TOKEN = "x" }\n' + NETWORK + SECRET)
    assert error.startswith(":7:1: secrets.github.env: [kernel] env sets GITHUB_TOKEN too")


def test_two_secrets_in_one_variable_are_refused_at_the_second(write_config: WriteConfig) -> None:
    other = '[secrets.other]\nvalue = "${OTHER}"\nenv = "GITHUB_TOKEN"\nhosts = ["api.github.com"]\n'
    error = load_error(write_config, NETWORK + SECRET + other)
    assert error.startswith(":9:1: secrets.other.env: secret 'github' holds its placeholder in GITHUB_TOKEN")


def test_kernel_env_using_a_secret_variable_is_refused_at_its_key(write_config: WriteConfig) -> None:
    error = load_error(write_config, '[kernel]\nenv = { GH = "Bearer ${GITHUB_PAT}" }\n' + NETWORK + SECRET)
    assert error.startswith(":2:9: kernel.env.GH: ${GITHUB_PAT} is the value of secret 'github'")


def test_a_host_kernels_cannot_reach_is_refused_at_its_entry(write_config: WriteConfig) -> None:
    network = '[sandbox.network]\nallowedDomains = ["github.com"]\n'
    error = load_error(write_config, network + SECRET)
    assert error.startswith(":6:10: secrets.github.hosts[0]: kernels can't reach 'api.github.com'")
    assert error.endswith("add it to [sandbox.network] allowedDomains")
    denied = NETWORK + 'deniedDomains = ["api.github.com"]\n' + SECRET
    assert "deniedDomains has 'api.github.com'" in load_error(write_config, denied)


def test_secrets_without_the_sandbox_are_refused_at_the_secret(write_config: WriteConfig) -> None:
    error = load_error(write_config, "[sandbox]\nenabled = false\n" + SECRET)
    assert error.startswith(":3:10: secrets.github: [secrets] are put in requests by the sandbox's proxy")
    assert "unsandboxed kernels reach the network directly" in error


def test_secrets_with_remote_kernels_are_refused(write_config: WriteConfig) -> None:
    error = load_error(write_config, '[kernel.gateway]\nurl = "https://eg.example.com"\n' + NETWORK + SECRET)
    assert error.startswith(":5:10: secrets.github:") and "[kernel.gateway]" in error


def test_a_command_in_the_workspace_is_refused(write_config: WriteConfig, workspace: Path) -> None:
    secret = SECRET.replace('value = "${GITHUB_PAT}"', f'command = ["{workspace}/get-token.sh"]')
    error = load_error(write_config, NETWORK + secret)
    assert (
        error.startswith(":4:12: secrets.github.command[0]: the program is in")
        and "kernels can write" in error
    )


def test_a_program_found_on_path_only_in_the_workspace_is_refused(
    write_config: WriteConfig, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A virtual environment of the workspace on the host's PATH: a kernel can put programs there.
    (workspace / "bin").mkdir()
    (workspace / "bin" / "get-token").write_text("#!/bin/sh\necho x\n")
    (workspace / "bin" / "get-token").chmod(0o755)
    monkeypatch.setenv("PATH", f"{workspace / 'bin'}:/usr/bin:/bin")
    secret = SECRET.replace('value = "${GITHUB_PAT}"', 'command = ["get-token"]')
    error = load_error(write_config, NETWORK + secret)
    assert error.startswith(
        ":4:12: secrets.github.command[0]: the program 'get-token' is found on PATH only in"
    )
    assert "where kernels can write" in error


def test_a_file_argument_in_the_workspace_is_refused_at_its_index(
    write_config: WriteConfig, workspace: Path
) -> None:
    (workspace / "token.py").write_text("print('x')\n")
    secret = SECRET.replace('value = "${GITHUB_PAT}"', f'command = ["{sys.executable}", "-u", "token.py"]')
    error = load_error(write_config, NETWORK + secret)
    assert error.startswith(":4:") and "secrets.github.command[2]: 'token.py' is a file in" in error, error


def test_a_command_runs_with_path_entries_kernels_can_write_left_out(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    for directory, said in ((workspace / "bin", "planted"), (outside, "real")):
        directory.mkdir(parents=True)
        (directory / "get-token").write_text(f"#!/bin/sh\necho {said}-token\n")
        (directory / "get-token").chmod(0o755)
    environ = {"PATH": f"{workspace / 'bin'}:relative:{outside}:/usr/bin:/bin"}
    resolved = resolve_secrets(
        {"github": section(command=["get-token"])},
        environ=environ,
        dotenv_path=None,
        cwd=workspace,
        kernel_writable=[workspace],
    )
    assert resolved["github"].value == "real-token"


def test_a_timed_out_command_leaves_no_process_behind(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A child in its process group, and one that left it for a session of its own; neither holds the
    # command's output open (which would keep a reader waiting until they end).
    code = (
        "import subprocess, sys, time\n"
        "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
        "a = subprocess.Popen(['sleep', '60'], **quiet)\n"
        "b = subprocess.Popen(['sleep', '60'], start_new_session=True, **quiet)\n"
        f"open({str(pids)!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n"
        "time.sleep(60)\n"
    )
    error = resolve_error(section(command=python(code), timeout=1))
    assert "did not finish within 1 s" in str(error)
    children = [int(pid) for pid in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while any(is_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in children if is_alive(pid)] == []


def test_a_bad_secret_name_is_refused_at_its_table(write_config: WriteConfig) -> None:
    error = load_error(write_config, NETWORK + SECRET.replace("secrets.github", "secrets.git-hub"))
    assert error.startswith(":3:10: secret name 'git-hub' is not valid") and "e.g. 'git_hub'" in error
