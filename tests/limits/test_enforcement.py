"""How limits are enforced: which limits each mechanism can't enforce (`unenforceable`), the error that names
them (`check_limits`), and which mechanism `detect_enforcement` picks from a machine's cgroup support. Pure
logic: the machine's support is passed in (`CgroupSupport`), the user and platform set per test."""

from __future__ import annotations

import os
import sys

import pytest

from ipybox.errors import IpyboxError
from ipybox.limits import enforcement as enforcement_module
from ipybox.limits.cgroups import Cgroup, CgroupSupport
from ipybox.limits.enforcement import Enforcement, LimitUnavailableError, check_limits, detect_enforcement
from ipybox.limits.spec import ResourceLimits, WorkspaceLimits

RLIMIT = Enforcement("rlimit", None, ("cgroup v2: not mounted", "cgroup v1: no pids hierarchy mounted"))
CGROUP1 = Enforcement("cgroup1", Cgroup(1, {"memory": "/sys/fs/cgroup/memory/x", "pids": "/p", "cpu": "/c"}))
CGROUP2 = Enforcement("cgroup2", Cgroup(2, {"": "/sys/fs/cgroup/user.slice/x.scope"}))
EVERYTHING = ResourceLimits(memory="1GiB", cpus=1.5, processes=64, open_files=256, tmp="64MiB")


@pytest.fixture(params=[0, 1000], ids=["root", "user"])
def euid(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    uid: int = request.param
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    return uid


@pytest.mark.parametrize("enforcement", [CGROUP1, CGROUP2], ids=["cgroup1", "cgroup2"])
def test_a_cgroup_enforces_every_limit_of_a_sandboxed_kernel(enforcement: Enforcement, euid: int) -> None:
    assert enforcement.unenforceable(EVERYTHING, sandboxed=True) == {}


def test_setrlimit_cannot_cap_cpu(euid: int) -> None:
    missing = RLIMIT.unenforceable(ResourceLimits(cpus=0.5), sandboxed=True)

    assert missing == {"cpus": "a CPU cap needs a control group"}


def test_setrlimit_cannot_limit_the_processes_of_root_but_can_those_of_a_user(euid: int) -> None:
    missing = RLIMIT.unenforceable(ResourceLimits(processes=64), sandboxed=True)

    if euid == 0:
        assert missing == {"processes": "RLIMIT_NPROC does not apply to root"}
    else:
        assert missing == {}


def test_setrlimit_limits_memory_of_a_sandbox_with_a_sized_tmp_and_open_files_on_linux(euid: int) -> None:
    limits = ResourceLimits(memory="1GiB", open_files=64, file_size="1GiB", tmp="64MiB")

    assert RLIMIT.unenforceable(limits, sandboxed=True) == {}
    assert RLIMIT.unenforceable(ResourceLimits(open_files=64, file_size="1GiB"), sandboxed=False) == {}


def test_setrlimit_refuses_memory_of_an_unsandboxed_kernel_which_the_hosts_dev_shm_would_hold_past_it(
    euid: int,
) -> None:
    missing = RLIMIT.unenforceable(ResourceLimits(memory="2GiB"), sandboxed=False)

    assert list(missing) == ["memory"]
    assert "host's /dev/shm" in missing["memory"] and "sandbox it with a tmp limit" in missing["memory"]
    assert "control group" in missing["memory"]
    assert CGROUP1.unenforceable(ResourceLimits(memory="2GiB"), sandboxed=False) == {}


@pytest.mark.parametrize("private_tmp", [True, False])
def test_setrlimit_refuses_memory_of_a_sandbox_whose_tmp_is_an_unsized_tmpfs(private_tmp: bool) -> None:
    limits = ResourceLimits(memory="2GiB", tmp=None if private_tmp else "64MiB")

    missing = RLIMIT.unenforceable(limits, sandboxed=True, private_tmp=private_tmp)

    assert "unsized in-memory filesystems" in missing["memory"] and "set tmp too" in missing["memory"]
    assert CGROUP2.unenforceable(limits.model_copy(update={"tmp": None}), sandboxed=True) == {}


def test_setrlimit_refuses_memory_where_no_seccomp_filter_can_be_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(enforcement_module, "seccomp_unavailable", lambda: "libseccomp is not installed")

    missing = RLIMIT.unenforceable(ResourceLimits(memory="2GiB", tmp="64MiB"), sandboxed=True)

    assert (
        "memfd_create and shmget" in missing["memory"] and "libseccomp is not installed" in missing["memory"]
    )


def test_setrlimit_refuses_a_memory_limit_below_what_an_idle_kernel_reserves(euid: int) -> None:
    missing = RLIMIT.unenforceable(ResourceLimits(memory="512MiB"), sandboxed=False)
    assert (
        list(missing) == ["memory"] and "address space" in missing["memory"] and "1 GiB" in missing["memory"]
    )
    assert CGROUP1.unenforceable(ResourceLimits(memory="512MiB"), sandboxed=False) == {}


def test_setrlimit_cannot_limit_memory_on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")

    assert RLIMIT.unenforceable(ResourceLimits(memory="1GiB"), sandboxed=True) == {
        "memory": "macOS does not enforce RLIMIT_AS, and has no control groups"
    }


@pytest.mark.parametrize("enforcement", [RLIMIT, CGROUP1, CGROUP2], ids=["rlimit", "cgroup1", "cgroup2"])
def test_tmp_of_an_unsandboxed_kernel_is_unenforceable_whatever_the_mechanism(
    enforcement: Enforcement,
) -> None:
    missing = enforcement.unenforceable(ResourceLimits(tmp="1GiB"), sandboxed=False)

    assert missing == {"tmp": "an unsandboxed kernel has no private /tmp to size (it shares the host's)"}


@pytest.mark.parametrize("enforcement", [RLIMIT, CGROUP1, CGROUP2], ids=["rlimit", "cgroup1", "cgroup2"])
def test_tmp_of_a_sandbox_without_a_private_tmp_is_unenforceable(enforcement: Enforcement) -> None:
    missing = enforcement.unenforceable(ResourceLimits(tmp="1GiB"), sandboxed=True, private_tmp=False)

    assert missing == {"tmp": "this platform's sandbox gives kernels no private /tmp to size"}


def test_the_workspace_defaults_unsandboxed_need_tmp_lifted(euid: int) -> None:
    limits = WorkspaceLimits()

    assert set(CGROUP1.unenforceable(limits, sandboxed=False)) == {"tmp"}
    assert CGROUP1.unenforceable(limits.without_tmp(), sandboxed=False) == {}


def test_every_unenforceable_limit_is_named_at_once(euid: int) -> None:
    missing = RLIMIT.unenforceable(EVERYTHING, sandboxed=False)

    assert set(missing) == (
        {"tmp", "cpus", "processes", "memory"} if euid == 0 else {"tmp", "cpus", "memory"}
    )


def test_check_limits_passes_what_can_be_enforced() -> None:
    check_limits(EVERYTHING, CGROUP1, sandboxed=True, source="[kernel.limits]")
    check_limits(ResourceLimits(), RLIMIT, sandboxed=False)


def test_the_error_names_each_limit_why_how_to_lift_it_and_where_it_was_set(euid: int) -> None:
    limits = ResourceLimits(cpus=1.5, tmp="1GiB", memory="2GiB")

    with pytest.raises(LimitUnavailableError) as refused:
        check_limits(limits, RLIMIT, sandboxed=False, source="[kernel.limits]")

    message = str(refused.value)
    assert message.startswith("[kernel.limits] asks for limits this machine cannot enforce: ")
    assert "cpus 1.5: a CPU cap needs a control group" in message
    assert "/tmp 1 GiB: an unsandboxed kernel has no private /tmp to size" in message
    assert "memory 2 GiB: setrlimit counts mapped memory only" in message
    assert "(cgroup v2: not mounted; cgroup v1: no pids hierarchy mounted)" in message, "why no cgroup"
    lift = message.split("Lift them (")[1].split(")")[0]
    assert sorted(lift.removesuffix(" in [kernel.limits]").split(", ")) == [
        'cpus = "unlimited"',
        'memory = "unlimited"',
        'tmp = "unlimited"',
    ]
    assert "ipybox doctor" in message


def test_the_error_under_a_cgroup_leaves_out_why_setrlimit_was_not_needed() -> None:
    problems = Enforcement("cgroup1", CGROUP1.cgroup, ("cgroup v2: not mounted",))

    with pytest.raises(LimitUnavailableError) as refused:
        check_limits(ResourceLimits(tmp="1GiB"), problems, sandboxed=False, source="[servers.fs.limits]")

    assert "cgroup v2" not in str(refused.value)
    assert 'tmp = "unlimited" in [servers.fs.limits]' in str(refused.value)


def test_the_error_is_an_ipybox_error() -> None:
    assert issubclass(LimitUnavailableError, IpyboxError)
    assert issubclass(LimitUnavailableError, RuntimeError)


def test_describe_says_the_mechanism_and_where() -> None:
    assert CGROUP1.describe() == "cgroup v1 under /sys/fs/cgroup/memory/x"
    assert CGROUP2.describe() == "cgroup v2 under /sys/fs/cgroup/user.slice/x.scope"
    assert RLIMIT.describe() == (
        "setrlimit (address space, of sandboxed processes only, with memfd and shmget refused; user's "
        "processes; open files; no CPU cap) (cgroup v2: not mounted; cgroup v1: no pids hierarchy mounted)"
    )
    assert Enforcement("rlimit").describe() == (
        "setrlimit (address space, of sandboxed processes only, with memfd and shmget refused; user's "
        "processes; open files; no CPU cap)"
    )


def test_rlimit_asked_for_is_rlimit_even_where_a_cgroup_could_be_made() -> None:
    support = CgroupSupport(Cgroup(2, {"": "/g"}))

    enforcement = detect_enforcement("rlimit", support)

    assert enforcement == Enforcement("rlimit", None, ('enforce = "rlimit" was asked for',))


@pytest.mark.parametrize("enforce", ["auto", "cgroup"])
@pytest.mark.parametrize("version", [1, 2])
def test_auto_and_cgroup_take_the_group_the_machine_offers(enforce: str, version: int) -> None:
    base = Cgroup(1, {"memory": "/m"}) if version == 1 else Cgroup(2, {"": "/g"})
    support = CgroupSupport(base, ("cgroup v2: not mounted",) if version == 1 else ())

    enforcement = detect_enforcement(enforce, support)  # type: ignore[arg-type]

    assert enforcement == Enforcement(f"cgroup{version}", base, support.problems)  # type: ignore[arg-type]


def test_auto_without_a_group_falls_back_to_setrlimit_and_keeps_why() -> None:
    support = CgroupSupport(None, ("cgroup v2: not mounted", "cgroup v1: /p not writable by this user"))

    assert detect_enforcement("auto", support) == Enforcement("rlimit", None, support.problems)


def test_cgroup_insisted_on_without_a_group_is_an_error_saying_why_and_what_to_do() -> None:
    support = CgroupSupport(None, ("cgroup v2: not mounted", "cgroup v1: /p not writable by this user"))

    with pytest.raises(LimitUnavailableError) as refused:
        detect_enforcement("cgroup", support)

    message = str(refused.value)
    assert 'enforce = "cgroup", but no control group can be made here' in message
    assert "cgroup v2: not mounted; cgroup v1: /p not writable by this user" in message
    assert "as root or in a delegated cgroup v2 subtree" in message
    assert 'enforce = "auto"' in message


def test_a_platform_without_cgroups_is_setrlimit_or_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")

    assert detect_enforcement("auto") == Enforcement("rlimit", None, ("darwin has no control groups",))
    with pytest.raises(LimitUnavailableError, match="darwin has no control groups"):
        detect_enforcement("cgroup")


@pytest.mark.user_dependent  # the unprivileged pass runs it again: see tests/sandbox/test_unprivileged.py
def test_this_machine_enforces_by_cgroup_for_root_and_says_why_not_for_a_user() -> None:
    enforcement = detect_enforcement()

    if os.geteuid() == 0:
        assert enforcement.mechanism in ("cgroup1", "cgroup2"), enforcement.problems
        assert enforcement.cgroup is not None
    elif enforcement.mechanism == "rlimit":
        assert enforcement.cgroup is None
        assert enforcement.problems, "why no cgroup, for ipybox doctor"


def test_the_defaults_a_machine_cannot_enforce_are_named_with_why_and_the_rest_kept() -> None:
    # setrlimit can't bound an unsandboxed kernel's memory (the host's /dev/shm): a new ipybox.toml lifts it.
    unsandboxed = enforcement_module.unenforceable_defaults(sandboxed=False, enforcement=RLIMIT)
    assert "memory" in unsandboxed and "/dev/shm" in unsandboxed["memory"]
    assert "tmp" not in unsandboxed  # an unsandboxed kernel gets no tmp default to lift
    assert enforcement_module.unenforceable_defaults(sandboxed=True, enforcement=CGROUP1) == {}
    assert enforcement_module.unenforceable_defaults(sandboxed=False, enforcement=CGROUP1) == {}
