"""`ResourceLimits` and `WorkspaceLimits`: how `[kernel.limits]` spells limits, what lifts them, what is refused
and with which message, and how limits are shown (`format_bytes`, `describe_limit`). Pure logic."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ipybox.limits.spec import LIMIT_NAMES, GiB, ResourceLimits, WorkspaceLimits, describe_limit, format_bytes

MiB = 1024**2


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("4 gib", 4 * GiB),
        ("2 GB", 2 * 10**9),
        (" 64 KiB ", 64 * 1024),
        ("1000", 1000),
        (123456, 123456),
    ],
)
def test_sizes_are_bytes_or_numbers_with_a_unit(text: str | int, size: int) -> None:
    limits = ResourceLimits(memory=text, tmp=text)

    assert limits.memory == size
    assert limits.tmp == size


@pytest.mark.parametrize("name", LIMIT_NAMES)
@pytest.mark.parametrize("spelling", ["unlimited", "Unlimited", " UNLIMITED "])
def test_unlimited_lifts_any_limit_in_any_case(name: str, spelling: str) -> None:
    assert getattr(ResourceLimits(**{name: spelling}), name) is None


@pytest.mark.parametrize("name", LIMIT_NAMES)
def test_unlimited_lifts_a_workspace_default_and_leaves_the_others(name: str) -> None:
    defaults = WorkspaceLimits().set_limits()

    lifted = WorkspaceLimits(**{name: "unlimited"}).set_limits()

    assert name not in lifted
    assert lifted == {k: v for k, v in defaults.items() if k != name}


def test_workspace_defaults_are_4_gib_256_processes_4096_files_and_a_1_gib_tmp() -> None:
    assert WorkspaceLimits().set_limits() == {
        "memory": 4 * GiB,
        "processes": 256,
        "open_files": 4096,
        "tmp": 1 * GiB,
    }
    assert WorkspaceLimits().enforce == "auto"


def test_the_sdk_sets_no_limit_unless_asked() -> None:
    limits = ResourceLimits()

    assert limits.set_limits() == {}
    assert not limits.any


@pytest.mark.parametrize("name", LIMIT_NAMES)
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_refused_with_a_message_that_says_to_write_unlimited(name: str, value: bool) -> None:
    with pytest.raises(ValidationError) as refused:
        ResourceLimits(**{name: value})

    message = str(refused.value)
    assert name in message
    assert f'use "unlimited" to lift a limit, not {str(value).lower()}' in message


@pytest.mark.parametrize("text", ["abc", "4 GiBs", "-1GiB", "4 G i B", ""])
def test_a_bad_size_is_refused_with_a_message_naming_it_and_showing_the_spellings(text: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ResourceLimits(tmp=text)

    message = str(refused.value)
    assert "tmp" in message
    assert f"not a size: {text!r}" in message
    assert '"4GiB"' in message and '"unlimited"' in message


@pytest.mark.parametrize(
    ("name", "value"),
    [("memory", 0), ("tmp", "0"), ("cpus", 0), ("cpus", -1.0), ("processes", 0), ("open_files", 15)],
)
def test_limits_below_their_minimum_are_refused(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=name):
        ResourceLimits(**{name: value})


def test_an_unknown_key_is_refused_not_ignored() -> None:
    with pytest.raises(ValidationError, match="memroy"):
        ResourceLimits(memroy="1GiB")  # type: ignore[call-arg]


def test_an_unknown_enforcement_is_refused() -> None:
    with pytest.raises(ValidationError, match="enforce"):
        ResourceLimits(enforce="seccomp")  # type: ignore[arg-type]


def test_limits_are_frozen() -> None:
    limits = ResourceLimits(memory="1GiB")

    with pytest.raises(ValidationError):
        limits.memory = None  # type: ignore[misc]


def test_set_limits_lists_the_set_limits_in_report_order() -> None:
    limits = ResourceLimits(tmp="1GiB", open_files=64, cpus=1.5, memory="2GiB", processes=8)

    assert list(limits.set_limits().items()) == [
        ("memory", 2 * GiB),
        ("cpus", 1.5),
        ("processes", 8),
        ("open_files", 64),
        ("tmp", GiB),
    ]


def test_enforce_alone_sets_no_limit() -> None:
    limits = ResourceLimits(enforce="cgroup")

    assert limits.set_limits() == {}
    assert not limits.any


@pytest.mark.parametrize("name", LIMIT_NAMES)
def test_any_limit_makes_any_true(name: str) -> None:
    value = {
        "memory": "1GiB",
        "cpus": 0.5,
        "processes": 4,
        "open_files": 16,
        "file_size": "1MiB",
        "tmp": "1MiB",
        "disk": "1MiB",
    }[name]

    assert ResourceLimits(**{name: value}).any


def test_without_tmp_drops_only_tmp_and_keeps_the_type() -> None:
    limits = WorkspaceLimits(cpus=2, enforce="rlimit")

    unsandboxed = limits.without_tmp()

    assert unsandboxed.tmp is None
    assert unsandboxed.set_limits() == {k: v for k, v in limits.set_limits().items() if k != "tmp"}
    assert unsandboxed.enforce == "rlimit"
    assert isinstance(unsandboxed, WorkspaceLimits)
    assert limits.tmp == GiB, "the original is unchanged"


def test_limits_round_trip_through_json() -> None:
    limits = WorkspaceLimits(cpus=1.5, open_files="unlimited")

    assert ResourceLimits.model_validate(limits.model_dump(mode="json")) == ResourceLimits(
        **limits.model_dump()
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (4 * GiB, "4 GiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (512 * MiB, "512 MiB"),
        (150 * MiB + MiB // 4, "150 MiB"),
        (100 * 1024, "100 KiB"),
        (1536, "1.5 KiB"),
        (1024, "1 KiB"),
        (1023, "1023 B"),
        (12, "12 B"),
        (0, "0 B"),
        (2048 * GiB, "2048 GiB"),
    ],
)
def test_format_bytes_shows_the_largest_unit_with_at_most_one_decimal(value: int, shown: str) -> None:
    assert format_bytes(value) == shown


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("memory", 4 * GiB, "memory 4 GiB"),
        ("tmp", GiB, "/tmp 1 GiB"),
        ("cpus", 1.5, "cpus 1.5"),
        ("cpus", 2, "cpus 2"),
        ("processes", 256, "processes 256"),
        ("open_files", 4096, "open files 4096"),
    ],
)
def test_describe_limit_reads_as_a_person_would_write_it(name: str, value: float, shown: str) -> None:
    assert describe_limit(name, value) == shown
