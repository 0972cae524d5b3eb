"""`ipybox.sandbox.container`: how a container is recognised, the explanation a workspace that enables the
sandbox fails with there, and the note ipybox's image prints when kernels run unsandboxed.

Pure logic over a directory standing in for `/` and a dictionary standing in for the environment; the
image itself is checked by `scripts/test-docker`. One test runs a stand-in bubblewrap that fails as it does
under Docker's default seccomp profile, to see the error a workspace gets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ipybox.sandbox import SandboxUnavailableError
from ipybox.sandbox.bwrap import check_sandbox
from ipybox.sandbox.container import (
    IMAGE_ENV,
    NESTING_FLAGS,
    container_remedy,
    detect_container,
    unsandboxed_note,
)

# What bubblewrap 0.8 says in a Docker container with the default seccomp profile (measured).
DOCKER_REFUSAL = "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged user namespaces."


def test_a_plain_machine_is_not_a_container(tmp_path: Path) -> None:
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("12:pids:/\n0::/init.scope\n")
    assert detect_container(tmp_path, {}) is None


def test_nothing_to_read_is_not_a_container(tmp_path: Path) -> None:
    assert detect_container(tmp_path, {}) is None


@pytest.mark.parametrize(
    ("marker", "evidence"),
    [(".dockerenv", "Docker: /.dockerenv"), ("run/.containerenv", "Podman: /run/.containerenv")],
)
def test_the_file_a_runtime_leaves_names_the_runtime(tmp_path: Path, marker: str, evidence: str) -> None:
    (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / marker).touch()
    assert detect_container(tmp_path, {}) == evidence


def test_the_container_variable_and_pid_1s_cgroup_count_too(tmp_path: Path) -> None:
    assert detect_container(tmp_path, {"container": "lxc"}) == "container=lxc"
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/kubepods/burstable/pod1234/abcd\n")
    assert detect_container(tmp_path, {}) == "PID 1's cgroup names kubepods"


def test_ipybox_in_container_says_yes_or_no_whatever_the_files_say(tmp_path: Path) -> None:
    (tmp_path / ".dockerenv").touch()
    assert detect_container(tmp_path, {IMAGE_ENV: "1"}) == "ipybox's image: IPYBOX_IN_CONTAINER=1"
    assert detect_container(tmp_path, {IMAGE_ENV: "0"}) is None
    assert (
        detect_container(tmp_path, {IMAGE_ENV: "yes"}) == "Docker: /.dockerenv"
    )  # only 0 and 1 mean anything


def test_the_remedy_names_the_container_both_ways_on_and_their_cost() -> None:
    remedy = container_remedy("Docker: /.dockerenv")
    assert remedy.startswith("this is a container (Docker: /.dockerenv)")
    assert "seccomp" in remedy and "AppArmor" in remedy  # why
    assert "isolation boundary" in remedy and "`enabled = false` under [sandbox]" in remedy  # way 1
    assert f"`{NESTING_FLAGS}`" in remedy and "--privileged" in remedy  # way 2
    assert "loosens the container's own confinement" in remedy  # and its cost


def test_the_unsandboxed_note_is_the_images_only_and_only_when_unsandboxed() -> None:
    note = unsandboxed_note(False, {IMAGE_ENV: "1"})
    assert note is not None and "kernels run unsandboxed" in note and "ipybox doctor" in note
    assert unsandboxed_note(True, {IMAGE_ENV: "1"}) is None  # sandboxed: nothing to say
    assert unsandboxed_note(False, {}) is None  # outside the image unsandboxed is the owner's choice
    assert unsandboxed_note(False, {IMAGE_ENV: "0"}) is None


@pytest.mark.integration
def test_in_a_container_a_refused_sandbox_fails_with_the_container_remedy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho '{DOCKER_REFUSAL}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(IMAGE_ENV, "1")
    check_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError) as refused:
            check_sandbox()
    finally:
        check_sandbox.cache_clear()
    message = str(refused.value)
    assert message.startswith(f"bubblewrap cannot create a sandbox here ({DOCKER_REFUSAL})")
    assert message.endswith(container_remedy("ipybox's image: IPYBOX_IN_CONTAINER=1"))
