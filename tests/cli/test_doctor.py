"""`ipybox doctor`'s limits report (`ipybox.cli.doctor`): the lines for an `Enforcement` built by hand (a
control group; `setrlimit` as root and as another user; a sandbox without a private `/tmp`), the real
command on this machine (as root and as an unprivileged user), and the limits page (docs/limits.md), whose
defaults and doctor excerpt must be what the code says."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ipybox.cli import doctor
from ipybox.cli.doctor import limits_report
from ipybox.limits import Enforcement, ResourceLimits, WorkspaceLimits, detect_enforcement
from ipybox.limits.cgroups import Cgroup
from ipybox.limits.disk import Filesystem, filesystem_of, no_quota_reason
from ipybox.sandbox.doctor import Check

ROOT = Path(__file__).resolve().parents[2]
IPYBOX = Path(sys.executable).parent / "ipybox"
V2_PROBLEM = (
    "cgroup v2: /sys/fs/cgroup/unified has no memory, pids, cpu controllers (they are bound to cgroup v1)"
)
CGROUP1 = Enforcement(
    "cgroup1",
    Cgroup(
        1,
        {"memory": "/sys/fs/cgroup/memory/x", "pids": "/sys/fs/cgroup/pids/x", "cpu": "/sys/fs/cgroup/cpu/x"},
    ),
    (V2_PROBLEM,),
)
RLIMIT = Enforcement("rlimit", None, ("cgroup v2: not mounted", "no control group can be made (test)"))
UNPRIVILEGED_USER = "ipybox-test"  # made by scripts/test-user


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_with_a_control_group_every_default_is_enforced_and_the_missing_v2_is_explained() -> None:
    checks = _by_name(limits_report(CGROUP1, private_tmp=True).checks)
    assert list(checks) == [
        "limits enforced by",
        "limits via cgroup v2",
        "default limits, sandboxed kernels",
        "default limits, unsandboxed kernels",
        "disk",
    ]
    assert checks["limits enforced by"] == Check(
        "limits enforced by", True, "cgroup v1 under /sys/fs/cgroup/memory/x", False
    )
    assert checks["limits via cgroup v2"] == Check(
        "limits via cgroup v2", False, V2_PROBLEM.removeprefix("cgroup v2: "), False
    )
    sandboxed = checks["default limits, sandboxed kernels"]
    assert sandboxed.ok
    assert sandboxed.detail == "enforced: memory 4 GiB, processes 256, open files 4096, /tmp 1 GiB"


def test_unsandboxed_kernels_are_not_given_the_default_tmp_limit_and_the_line_says_why() -> None:
    report = limits_report(CGROUP1, private_tmp=True)
    unsandboxed = _by_name(report.checks)["default limits, unsandboxed kernels"]
    assert unsandboxed.ok and "/tmp 1 GiB" not in unsandboxed.detail
    assert unsandboxed.detail.endswith("no /tmp limit: an unsandboxed kernel shares the host's /tmp")
    assert report.unenforceable == {"sandboxed": {}, "unsandboxed": {}}


@pytest.mark.parametrize("euid", [0, 1000], ids=["root", "another-user"])
def test_with_setrlimit_the_process_limit_is_unenforceable_for_root_only(
    euid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sys.platform != "linux":
        pytest.skip("on macOS setrlimit enforces no memory limit either")
    # The one input of this pure decision that is not in the Enforcement: who ipybox runs as.
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    report = limits_report(RLIMIT, private_tmp=True)
    checks = _by_name(report.checks)
    mechanism = checks["limits enforced by"]
    assert not mechanism.ok and mechanism.detail.startswith("setrlimit (")
    assert "not mounted" not in mechanism.detail  # each problem has a line of its own instead
    assert checks["limits via cgroup v2"].detail == "not mounted"
    assert checks["limits via control groups"].detail == "no control group can be made (test)"
    sandboxed = checks["default limits, sandboxed kernels"]
    if euid == 0:
        why = RLIMIT.unenforceable(WorkspaceLimits(), sandboxed=True)["processes"]
        assert report.unenforceable["sandboxed"] == {"processes": why}
        assert not sandboxed.ok and not sandboxed.required  # limits never decide doctor's exit status
        assert sandboxed.detail.startswith(f"can't enforce processes 256 ({why}), so a workspace won't start")
        assert 'set processes = "unlimited" in [kernel.limits], or run where it can be' in sandboxed.detail
        assert "; enforced: memory 4 GiB, open files 4096" in sandboxed.detail
    else:
        assert report.unenforceable["sandboxed"] == {}
        assert sandboxed.ok and sandboxed.detail.startswith(
            "enforced: memory 4 GiB, processes 256, open files 4096"
        )
    # setrlimit can't bound an unsandboxed kernel's memory (the host's /dev/shm), for root or not.
    unsandboxed = checks["default limits, unsandboxed kernels"]
    assert list(report.unenforceable["unsandboxed"]) == (["processes", "memory"] if euid == 0 else ["memory"])
    assert not unsandboxed.ok and "memory 4 GiB (setrlimit counts mapped memory only" in unsandboxed.detail
    assert 'memory = "unlimited" in [kernel.limits]' in unsandboxed.detail


def test_a_sandbox_without_a_private_tmp_names_the_tmp_default_as_unenforceable() -> None:
    report = limits_report(CGROUP1, private_tmp=False)
    line = _by_name(report.checks)["default limits, sandboxed kernels"]
    assert list(report.unenforceable["sandboxed"]) == ["tmp"]
    assert not line.ok and line.detail.startswith("can't enforce /tmp 1 GiB (this platform's sandbox")
    assert 'set tmp = "unlimited" in [kernel.limits]' in line.detail
    assert _by_name(report.checks)["default limits, unsandboxed kernels"].ok


def test_limits_set_by_hand_replace_the_defaults_and_several_missing_ones_are_named_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    report = limits_report(RLIMIT, ResourceLimits(cpus=2, processes=64), private_tmp=True)
    line = _by_name(report.checks)["default limits, sandboxed kernels"]
    assert list(report.unenforceable["sandboxed"]) == ["cpus", "processes"]
    assert (
        'set cpus = "unlimited", processes = "unlimited" in [kernel.limits], or run where they' in line.detail
    )
    assert "enforced:" not in line.detail  # nothing left that is


def test_the_json_form_carries_the_mechanism_its_problems_the_defaults_and_the_lines() -> None:
    report = limits_report(CGROUP1, private_tmp=True)
    data = json.loads(json.dumps(report.as_dict()))
    assert data["mechanism"] == "cgroup1" and data["description"] == CGROUP1.describe()
    assert data["problems"] == [V2_PROBLEM]
    assert data["defaults"] == {"memory": 4 * 1024**3, "processes": 256, "open_files": 4096, "tmp": 1024**3}
    assert data["unenforceable"] == {"sandboxed": {}, "unsandboxed": {}}
    assert data["checks"] == [check.as_dict() for check in report.checks]


@pytest.mark.integration  # runs the command, whose sandbox checks start bubblewrap
def test_the_doctor_command_reports_how_this_machine_enforces_limits() -> None:
    here = limits_report()
    done = subprocess.run([str(IPYBOX), "doctor"], capture_output=True, text=True, timeout=120, check=False)
    lines = done.stdout.splitlines()
    assert [check.line() for check in here.checks] == [line for line in lines if "limits" in line]
    assert lines.index(here.checks[0].line()) > lines.index(next(x for x in lines if "sandbox=True" in x))
    as_json = subprocess.run(
        [str(IPYBOX), "doctor", "--json"], capture_output=True, text=True, timeout=120, check=False
    )
    report = json.loads(as_json.stdout)
    assert report["limits"] == json.loads(json.dumps(here.as_dict()))
    assert done.returncode == as_json.returncode == (0 if report["sandbox"] else 1)
    if detect_enforcement().mechanism == "cgroup1":  # this machine: root, v1 memory/pids/cpu
        assert "     ok  limits enforced by: cgroup v1 under /sys/fs/cgroup/memory" in done.stdout
        assert "     no  limits via cgroup v2: " in done.stdout


@pytest.mark.integration
@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="running as another user takes root")
def test_as_an_unprivileged_user_doctor_reports_setrlimit_and_that_it_enforces_every_default() -> None:
    made = subprocess.run(
        ["bash", "scripts/test-user"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, f"scripts/test-user failed:\n{made.stderr}"
    python = made.stdout.strip().splitlines()[-1]
    user = pwd.getpwnam(UNPRIVILEGED_USER)
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": user.pw_dir,
        "USER": UNPRIVILEGED_USER,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # the checkout is not the user's to write
    }
    done = subprocess.run(
        ["bash", "scripts/test-user", "run", python, "-m", "ipybox.cli", "doctor", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    limits = json.loads(done.stdout)["limits"]
    assert limits["mechanism"] == "rlimit", limits  # v1 groups can't be made by a user; no delegated v2
    assert limits["problems"] and all(problem.startswith("cgroup v") for problem in limits["problems"])
    # RLIMIT_NPROC applies to users; memory needs the sandbox (an unsandboxed kernel has the host's /dev/shm)
    assert limits["unenforceable"]["sandboxed"] == {}
    assert list(limits["unenforceable"]["unsandboxed"]) == ["memory"]


def _limits_page() -> str:
    return (ROOT / "docs" / "limits.md").read_text()


def test_the_limits_pages_table_is_the_workspace_defaults() -> None:
    block = _limits_page().split("```toml\n", 1)[1].split("```", 1)[0]
    assert WorkspaceLimits(**tomllib.loads(block)["kernel"]["limits"]) == WorkspaceLimits()


def test_the_limits_pages_doctor_excerpt_is_what_doctor_prints_for_that_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if sys.platform != "linux":
        pytest.skip("the excerpt is Linux's")
    excerpt = _limits_page().split("read-only\n(as in a container):\n\n```\n", 1)[1].split("```", 1)[0]
    lines = excerpt.splitlines()
    # The machine of the excerpt: root, no control group could be made, for the reasons its lines give.
    prefix = "     no  limits via "
    problems = tuple(line.removeprefix(prefix) for line in lines if line.startswith(prefix))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "filesystem_of", lambda path: Filesystem("/home", "ext4", frozenset({"rw"})))
    report = limits_report(Enforcement("rlimit", None, problems), private_tmp=True)
    assert [check.line() for check in report.checks] == lines


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 8:2 / /srv rw,relatime shared:2 - xfs /dev/sdb1 rw,attr2,inode64,prjquota
31 30 8:3 / /srv/with\\040space rw shared:3 - ext4 /dev/sdc1 rw
"""


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/home/me/project", "/ (ext4) has no project quotas (mount option prjquota)"),
        ("/srv/project", "project quotas are on for /srv (xfs), but setting one takes root"),
        ("/srv/with space/project", "/srv/with space (ext4) has no project quotas"),
    ],
)
def test_the_disk_line_says_there_is_no_disk_quota_why_and_what_ipybox_does_instead(
    path: str, reason: str, tmp_path: Path
) -> None:
    filesystem = filesystem_of(Path(path), MOUNTINFO)
    assert reason in no_quota_reason(filesystem)

    line = _by_name(limits_report(CGROUP1, WorkspaceLimits(file_size="2GiB"), workspace=tmp_path).checks)[
        "disk"
    ]

    assert not line.ok and line.detail.startswith("no disk quota for kernels' writes here: ")
    assert "; what ipybox does instead: the audit log keeps a 1 MiB reserve" in line.detail
    assert "file_size in [kernel.limits] bounds each file a kernel writes (set to 2 GiB)" in line.detail


def test_the_disk_line_is_ok_where_the_workspace_has_project_quotas_ipybox_can_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    srv = filesystem_of(Path("/srv/project"), MOUNTINFO)
    monkeypatch.setattr(doctor, "filesystem_of", lambda path: srv)
    monkeypatch.setattr(doctor, "quota_unavailable", lambda path: None)

    line = _by_name(limits_report(CGROUP1, workspace=tmp_path).checks)["disk"]

    assert line.ok
    assert line.detail == "project quotas on /srv (xfs): disk in [kernel.limits] bounds the workspace"
