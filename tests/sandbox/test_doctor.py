"""`ipybox doctor`'s checks (`ipybox.sandbox.doctor`): here, the container check; the command's output is
tested in tests/cli/test_main.py, and the image's doctor by scripts/test-docker."""

from __future__ import annotations

import platform

import pytest

from ipybox.sandbox.container import NESTING_FLAGS
from ipybox.sandbox.doctor import Check, container_check, run_checks, sandbox_ready

NAMESPACES_OK = Check("namespaces (user, pid, net, mount)", True, "a test sandbox started", True)
NAMESPACES_REFUSED = Check("namespaces (user, pid, net, mount)", False, "bubblewrap cannot ...", True)


def test_outside_a_container_the_container_check_passes_and_says_so() -> None:
    check = container_check(NAMESPACES_REFUSED, None)
    assert check == Check("container", True, "not in a container", False)


def test_a_container_that_lets_bubblewrap_nest_passes() -> None:
    check = container_check(NAMESPACES_OK, "Docker: /.dockerenv")
    assert check.ok and check.detail == "Docker: /.dockerenv; bubblewrap nests in it"


def test_a_container_that_blocks_bubblewrap_explains_why_and_the_flags_that_would_let_it_nest() -> None:
    check = container_check(NAMESPACES_REFUSED, "Docker: /.dockerenv")
    assert not check.ok and not check.required  # the namespaces check is the one sandbox=True needs
    assert check.detail.startswith("This is a container (Docker: /.dockerenv)")
    assert "isolation boundary" in check.detail and NESTING_FLAGS in check.detail


@pytest.mark.integration  # the namespaces check starts bubblewrap
def test_the_container_check_follows_the_namespaces_check_and_never_decides_readiness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if platform.system() != "Linux":
        pytest.skip("the container check is part of the Linux checks")
    monkeypatch.setenv("IPYBOX_IN_CONTAINER", "1")
    checks = run_checks()
    names = [check.name for check in checks]
    assert names[:3] == ["bubblewrap", "namespaces (user, pid, net, mount)", "container"]
    container = checks[2]
    assert container.detail.startswith(("ipybox's image", "This is a container (ipybox's image"))
    assert container.ok == checks[1].ok
    assert sandbox_ready(checks) == all(check.ok for check in checks[:2])
