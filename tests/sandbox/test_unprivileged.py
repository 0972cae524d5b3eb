"""The sandbox tests as an unprivileged user too: users are not root, and a sandbox can behave differently
for them (bubblewrap makes a user namespace then, `~` is another home, host permissions apply).

Run as root (as CI is), this test runs again, as the user `ipybox-test` (which `scripts/test-user` creates
together with a Python that user can run), the tests that exercise permissions, and checks that all of them
passed, this one included: there it takes the other branch and checks that it runs unprivileged. Run
unprivileged, the other sandbox tests already are the unprivileged run: it only checks that.

What it runs again (`SELECTION`, less what is marked `root_only`), and why:
- The tests of tests/sandbox and tests/limits that start processes (`integration`): bubblewrap makes a user
  namespace for a user, `~` is another home, limits come from setrlimit instead of a control group.
- The attacks on what the host reads, executes or writes for a workspace (`ATTACK_TESTS`) that start
  processes: host permissions apply to a user, root passes every mode check.
- The tests that start nothing but whose checks depend on the user (`user_dependent`: rlimits applied as a
  user, the user's task count, a file mode a user can't get past, this machine's control groups).
Not the other tests of those files: pure logic over inputs the test makes itself (a limit's spelling, an
address, a profile's text, a hostile layout made by the test's own user) gives the same answer for any user,
and ran already.

The checkout need not be readable by that user (a clone in `/root` or in a 0700 home is not):
`scripts/test-user run` shows it the checkout, at the same path, in a private mount namespace of the run's
own, and changes no permission on disk (its header says how; it costs milliseconds).
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.sandbox.conftest import UNPRIVILEGED_USER_VARIABLE

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_TESTS = "tests/sandbox"
# Attacks on the host's side of the sandbox boundary (credentials, registry, state, generated packages,
# outputs, registrations): they must hold for users that are not root too.
ATTACK_TESTS = (
    "tests/tool_server/test_attacks.py",
    "tests/kernels/test_output_privacy.py",
    "tests/mcp_apigen/test_package_symlinks.py",
    "tests/reconcile/test_generations_hostile.py",
    "tests/supervisor/test_state_dir_hostile.py",
    "tests/supervisor/test_hostile_checks.py",
    "tests/mcp_server/test_registration.py",
    "tests/mcp_server/test_files.py",
    "tests/supervisor/test_sandbox_required.py",
    "tests/supervisor/test_unattended_asks.py",
    "tests/cli/test_exec_workspace.py",
    "tests/executor/test_registry_scope.py",
)
SELECTION = [
    SANDBOX_TESTS,
    "tests/limits",
    *ATTACK_TESTS,
    "-m",
    "(integration or user_dependent) and not root_only",
]
USER = "ipybox-test"


def _tail(*outputs: str | bytes | None, lines: int = 60) -> str:
    """The last lines of a run's output, for a failure message."""
    text = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in outputs)
    return "\n".join(text.splitlines()[-lines:])


def _collected_as_root() -> set[str]:
    """Node ids of the sandbox tests, collected here (as root): what the other run must pass, all of it."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *SELECTION],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"collecting {SELECTION} failed:\n{_tail(done.stdout, done.stderr)}"
    ids = {line for line in done.stdout.splitlines() if "::" in line}
    assert len(ids) > 150, done.stdout  # the sandbox tests, not a stray few
    return ids


def _passed_in_report(report: Path) -> tuple[set[str], list[str]]:
    """Node ids that passed in a junit report, and every other outcome as `<kind> <node id>`."""
    passed: set[str] = set()
    others: list[str] = []
    for case in ElementTree.parse(report).iter("testcase"):
        node_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcomes = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        if outcomes:
            others.extend(f"{outcome} {node_id}" for outcome in outcomes)
        else:
            passed.add(node_id)
    return passed, others


@pytest.mark.slow(seconds=160)  # in CI: the suite's longest test, to be started first
@pytest.mark.timeout(900)
def test_sandbox_tests_pass_as_an_unprivileged_user() -> None:
    if os.geteuid() != 0:
        assert os.getuid() != 0 and os.geteuid() != 0
        expected_user = os.environ.get(UNPRIVILEGED_USER_VARIABLE)
        if expected_user is not None:  # the run started below, as root
            entry = pwd.getpwuid(os.geteuid())
            assert entry.pw_name == expected_user and os.getgid() == entry.pw_gid
            assert 0 not in os.getgroups()
        return
    assert UNPRIVILEGED_USER_VARIABLE not in os.environ, "the unprivileged run runs as root"

    made = subprocess.run(
        ["bash", "scripts/test-user"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, f"scripts/test-user failed:\n{made.stderr}"
    python = made.stdout.strip().splitlines()[-1]
    user = pwd.getpwnam(USER)
    expected = _collected_as_root()

    env = {
        "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", os.defpath)]),
        "HOME": user.pw_dir,
        "USER": USER,
        "LOGNAME": USER,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",  # the checkout is not the user's to write
        UNPRIVILEGED_USER_VARIABLE: USER,
    }
    # Not setpriv here: the checkout may be in a home directory the user can't enter (`/root/ipybox`), and
    # `run` makes it visible to the user in a private mount namespace, changing no permission on disk.
    command = ["bash", "scripts/test-user", "run", python, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    # In parallel, as scripts/test runs the suite: this one test is otherwise the run's longest by far.
    command += ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # longest modules first
    with tempfile.TemporaryDirectory(prefix="ipybox-unprivileged-") as reports:
        os.chown(reports, user.pw_uid, user.pw_gid)
        report = Path(reports) / "report.xml"
        try:
            done = subprocess.run(
                [*command, f"--junitxml={report}", *SELECTION],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=840,
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the sandbox tests as {USER} timed out:\n{_tail(e.stdout, e.stderr)}")
        output = done.stdout + done.stderr
        assert done.returncode == 0, (
            f"the sandbox tests failed as {USER} (exit {done.returncode}):\n{_tail(output)}"
        )
        passed, others = _passed_in_report(report)
    assert not others, f"not all passed as {USER}: {others}\n{_tail(output)}"
    assert passed == expected, (
        f"as {USER}, these did not run: {sorted(expected - passed)}; these ran but were not collected here: "
        f"{sorted(passed - expected)}\n{_tail(output)}"
    )
    # Only passes (and warnings; root-only tests deselected): a skip, an xfail or an error is no pass.
    summary = re.search(
        r"^(\d+) passed(, \d+ deselected)?(, \d+ warnings?)? in [\d.]+s", output, re.MULTILINE
    )
    assert summary is not None and int(summary.group(1)) == len(expected), _tail(output)
    this_test = (
        f"{SANDBOX_TESTS}/{Path(__file__).name}::{test_sandbox_tests_pass_as_an_unprivileged_user.__name__}"
    )
    assert this_test in passed  # there it took the unprivileged branch, and its checks passed


@pytest.mark.root_only
@pytest.mark.skipif(os.geteuid() != 0, reason="running a command as another user takes root")
def test_run_shows_the_user_a_checkout_in_a_closed_home_and_nothing_else_there(tmp_path: Path) -> None:
    made = subprocess.run(
        ["bash", "scripts/test-user"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, f"scripts/test-user failed:\n{made.stderr}"
    # A home only its owner may enter, holding a clone that is closed too, and another file.
    home = tmp_path / "alice"
    checkout = home / "ipybox"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "test-user").write_bytes((ROOT / "scripts" / "test-user").read_bytes())
    (checkout / "pyproject.toml").write_text("the checkout's own file\n")
    (home / "private.txt").write_text("the owner's other file\n")
    home.chmod(0o700)
    checkout.chmod(0o700)
    user = pwd.getpwnam(USER)

    setpriv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", "--"]
    run = ["bash", str(checkout / "scripts" / "test-user"), "run"]

    def as_user(*command: str, prefix: list[str] = run) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=60)

    denied = as_user("cat", str(checkout / "pyproject.toml"), prefix=setpriv)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr  # closed to the user on disk

    shown = as_user("sh", "-c", "id -u; pwd; cat pyproject.toml; ls -A ..")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [str(user.pw_uid), str(checkout), "the checkout's own file", "ipybox"]
    hidden = as_user("cat", str(home / "private.txt"))
    assert hidden.returncode != 0 and "No such file" in hidden.stderr
    unwritable = as_user("touch", str(checkout / "new-file"))
    assert unwritable.returncode != 0 and not (checkout / "new-file").exists()

    # Nothing changed on disk, and the mounts were the run's own: none is left here.
    assert (home.stat().st_mode & 0o777, checkout.stat().st_mode & 0o777) == (0o700, 0o700)
    assert str(home) not in Path("/proc/self/mountinfo").read_text()
