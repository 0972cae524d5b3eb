"""`~` in the sandbox policy is the home of the user who runs ipybox: its credential stores are the ones
hidden from the kernel, and the kernel runs as that user.

In the unprivileged run of test_unprivileged.py the home is the test user's own (from the password
database), where canary credentials are left for the next run; otherwise it is a home made for the test,
never the real user's, which is not written to.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.sandbox.policy import DEFAULT_DENY_READ
from tests.sandbox.conftest import OUTSIDE_PARENT, UNPRIVILEGED_USER_VARIABLE

pytestmark = pytest.mark.integration

# A credential file in each of the default hidden places (the place itself for the file ones).
CANARIES = {
    "~/.ssh": ".ssh/ipybox-test-canary",
    "~/.aws": ".aws/ipybox-test-canary",
    "~/.gnupg": ".gnupg/ipybox-test-canary",
    "~/.netrc": ".netrc",
    "~/.git-credentials": ".git-credentials",
    "~/.docker/config.json": ".docker/config.json",
    "~/.config/gh": ".config/gh/ipybox-test-canary",
    "~/.config/gcloud": ".config/gcloud/ipybox-test-canary",
    "~/.kube": ".kube/ipybox-test-canary",
    "~/.pypirc": ".pypirc",
    "~/.npmrc": ".npmrc",
}
SECRET = "ipybox-test-credential"


@dataclass
class Home:
    executor: CodeExecutor
    home: Path

    async def run(self, code: str) -> str:
        return ((await self.executor.execute(code, timeout=60)).text or "").strip()


def _test_users_home() -> Path | None:
    """The unprivileged test user's own home, when this is the run as that user."""
    if os.environ.get(UNPRIVILEGED_USER_VARIABLE) is None or os.geteuid() == 0:
        return None
    home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    assert Path.home() == home, f"HOME is {Path.home()}, not the user's home {home}"
    return home


@pytest.fixture(scope="module")
async def home(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Home]:
    users_home = _test_users_home()
    # Outside /tmp: the sandbox's private /tmp would hide a home there whatever the policy said.
    home = users_home or Path(tempfile.mkdtemp(prefix="ipybox-test-home-", dir=OUTSIDE_PARENT))
    assert not home.is_relative_to("/tmp")
    for relative in CANARIES.values():
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(f"{SECRET}\n")
    workspace = tmp_path_factory.mktemp("home-workspace")
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HOME", str(home))
            async with CodeExecutor(working_dir=workspace, sandbox=True) as executor:
                yield Home(executor, home)
    finally:
        if users_home is None:  # the test user's own canaries stay: other runs as that user may use them
            shutil.rmtree(home)


def test_every_default_place_has_a_canary() -> None:
    assert set(CANARIES) == set(DEFAULT_DENY_READ)


async def test_the_kernel_runs_as_this_user_with_this_home(home: Home) -> None:
    out = await home.run("import os\nprint(os.getuid(), os.geteuid(), os.environ['HOME'])")
    assert out == f"{os.getuid()} {os.geteuid()} {home.home}"


@pytest.mark.parametrize("place", sorted(CANARIES))
async def test_credential_stores_in_the_home_are_hidden(home: Home, place: str) -> None:
    path = home.home / CANARIES[place]
    assert path.is_file()  # there on the host
    code = f"try:\n    print(repr(open({str(path)!r}).read()))\nexcept OSError as e:\n    print(type(e).__name__)"
    out = await home.run(code)
    # A hidden directory is an empty one; a hidden file is /dev/null, which the sandbox can't open.
    assert out == ("PermissionError" if CANARIES[place] == place.removeprefix("~/") else "FileNotFoundError")


async def test_the_home_is_read_only(home: Home) -> None:
    target = home.home / "written-by-the-kernel"
    out = await home.run(f"try:\n    open({str(target)!r}, 'w')\nexcept OSError as e:\n    print(e.strerror)")
    assert out == "Read-only file system"
    assert not target.exists()
