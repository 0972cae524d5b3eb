"""`limited_argv`: the command line that starts a process inside its group and rlimits. The wrapped command
lines are run for real by `/bin/sh` (dash here): the limits are the ones asked for, soft and hard; a step
that fails stops the start with 125 before the command runs; nothing in the arguments is run as shell code.

Root may raise its own hard limits again (CAP_SYS_RESOURCE), so as root the limits test runs the wrapped
command as `nobody`, the case the rule is for; as another user it runs it as that user."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ipybox.limits.wrapper import FAILED_STATUS, SECCOMP_FD, SHELL, limited_argv

# The system Python: `nobody` can run it (the venv's may live in a 0700 home). -I -S: no site, no env.
PYTHON = ["/usr/bin/python3", "-I", "-S", "-c"]
ROOT = os.geteuid() == 0
# As root it runs the wrapped commands as `nobody`, as a user as that user: the unprivileged pass runs it again.
pytestmark = pytest.mark.user_dependent
NOBODY = 65534

READ_LIMITS = """
import json, resource
out = {}
for name in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_FSIZE"):
    which = getattr(resource, name)
    soft, hard = resource.getrlimit(which)
    try:
        resource.setrlimit(which, (hard + 1, hard + 1))
        raised = True
    except (ValueError, OSError):
        raised = False
    out[name] = {"soft": soft, "hard": hard, "raised": raised}
print(json.dumps(out))
"""


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, **kwargs)


def test_argv_is_unchanged_when_there_is_nothing_to_do() -> None:
    argv = ["/usr/bin/python3", "-c", "print(1)"]

    wrapped = limited_argv(argv)

    assert wrapped == argv
    assert wrapped is not argv, "a copy: the caller may change either"


def test_the_wrapper_is_a_posix_shell_with_the_steps_as_arguments_not_code() -> None:
    wrapped = limited_argv(
        ["cmd", "arg"], join=["/g/cgroup.procs"], open_files=64, processes=10, address_space=5000
    )

    assert wrapped[:2] == [SHELL, "-c"]
    assert wrapped[3:] == [
        "ipybox-limits",
        "nofile=64",
        "nproc=10",
        "as=4",
        "/g/cgroup.procs",
        "--",
        "cmd",
        "arg",
    ]


@pytest.mark.parametrize(
    ("size", "kib"), [(1, 1), (1023, 1), (1024, 1), (5000, 4), (512 * 1024**2, 512 * 1024)]
)
def test_the_address_space_is_rounded_down_to_kib_and_never_to_zero(size: int, kib: int) -> None:
    assert f"as={kib}" in limited_argv(["cmd"], address_space=size)


@pytest.mark.parametrize(
    "path",
    [
        "cgroup.procs",
        "sys/fs/cgroup/x/cgroup.procs",
        "",
        "--",
        "nofile=3",
        "as=1",
        "nproc=1",
        "fsize=1",
        "seccomp=/x",
        "./procs",
    ],
)
def test_a_join_path_that_is_not_absolute_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"not an absolute cgroup\.procs path"):
        limited_argv(["cmd"], join=[path])


@pytest.mark.integration
def test_the_wrapped_command_gets_soft_and_hard_limits_it_cannot_raise() -> None:
    wrapped = limited_argv(
        [*PYTHON, READ_LIMITS], open_files=64, processes=50, address_space=512 * 1024**2, file_size=10**6 + 1
    )

    done = _run(wrapped, cwd="/", **({"user": NOBODY, "group": NOBODY, "extra_groups": []} if ROOT else {}))

    assert done.returncode == 0, done.stderr
    limits = json.loads(done.stdout)
    assert limits["RLIMIT_NOFILE"] == {"soft": 64, "hard": 64, "raised": False}
    assert limits["RLIMIT_NPROC"] == {"soft": 50, "hard": 50, "raised": False}
    assert limits["RLIMIT_AS"] == {"soft": 512 * 1024**2, "hard": 512 * 1024**2, "raised": False}
    fsize = 10**6 // 512 * 512  # `ulimit -f` counts 512-byte blocks
    assert limits["RLIMIT_FSIZE"] == {"soft": fsize, "hard": fsize, "raised": False}


@pytest.mark.integration
def test_the_command_writes_its_own_pid_to_each_join_file_and_keeps_it_after_exec(tmp_path: Path) -> None:
    first, second = tmp_path / "a.procs", tmp_path / "b.procs"
    wrapped = limited_argv([*PYTHON, "import os; print(os.getpid())"], join=[str(first), str(second)])

    done = _run(wrapped)

    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()
    assert first.read_text().strip() == pid
    assert second.read_text().strip() == pid


@pytest.mark.integration
@pytest.mark.parametrize("procs", ["missing/cgroup.procs", "/proc/cgroup.procs"])
def test_a_join_that_cannot_be_written_exits_125_and_the_command_never_runs(
    procs: str, tmp_path: Path
) -> None:
    path = procs if procs.startswith("/") else str(tmp_path / procs)
    ran = tmp_path / "ran"
    wrapped = limited_argv(["/usr/bin/touch", str(ran)], join=[path], open_files=64)

    done = _run(wrapped)

    assert done.returncode == FAILED_STATUS
    assert path in done.stderr, "the shell's message names the file"
    assert not ran.exists()


@pytest.mark.integration
def test_a_limit_that_cannot_be_set_exits_125_and_the_command_never_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    # Above fs.nr_open (1048576 by default): refused to root too.
    wrapped = limited_argv(["/usr/bin/touch", str(ran)], open_files=10**9)

    done = _run(wrapped)

    assert done.returncode == FAILED_STATUS
    assert "limit" in done.stderr
    assert not ran.exists()


@pytest.mark.integration
def test_a_join_path_with_a_command_substitution_is_a_path_not_code(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    ran = tmp_path / "ran"
    path = f"{tmp_path}/$(touch {pwned})/`touch {pwned}`/cgroup.procs"

    done = _run(limited_argv(["/usr/bin/touch", str(ran)], join=[path]))

    assert done.returncode == FAILED_STATUS, "no such directory: the path was taken literally"
    assert not pwned.exists()
    assert not ran.exists()


@pytest.mark.integration
def test_a_join_path_with_a_semicolon_is_written_literally(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    directory = tmp_path / "a; touch pwned; b"
    directory.mkdir()
    procs = directory / "cgroup.procs"

    done = _run(limited_argv([*PYTHON, "import os; print(os.getpid())"], join=[str(procs)]), cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    assert procs.read_text().strip() == done.stdout.strip()
    assert not pwned.exists()


@pytest.mark.integration
def test_the_command_and_its_arguments_reach_exec_untouched(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    arguments = [f"$(touch {pwned})", "nofile=3", "--", "; touch x", "*", "", "a\nb"]

    done = _run(
        limited_argv(
            [*PYTHON, "import sys, json; print(json.dumps(sys.argv[1:]))", *arguments], open_files=64
        )
    )

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == arguments
    assert not pwned.exists()


@pytest.mark.integration
def test_the_seccomp_file_is_open_on_its_descriptor_for_the_command_and_nothing_else(tmp_path: Path) -> None:
    program = tmp_path / "filter.bpf"
    program.write_bytes(b"bpf")
    read = f"import os; print(os.read({SECCOMP_FD}, 10).decode(), os.get_inheritable({SECCOMP_FD}))"

    done = _run(limited_argv([*PYTHON, read], seccomp=str(program)))

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["bpf", "True"]


@pytest.mark.integration
def test_a_seccomp_file_that_cannot_be_opened_exits_125_and_the_command_never_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    done = _run(limited_argv(["/usr/bin/touch", str(ran)], seccomp=str(tmp_path / "missing")))

    assert done.returncode == FAILED_STATUS
    assert "missing" in done.stderr
    assert not ran.exists()
