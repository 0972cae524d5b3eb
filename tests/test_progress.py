"""`ipybox.progress`: the hub fans events out to the listeners subscribed now, a listener's bug never
reaches the operation, and parts are timed from their first event to their last."""

from __future__ import annotations

import logging

import pytest

from ipybox.progress import MAX_DETAIL, PartTimer, ProgressEvent, ProgressHub, emit_to, server_part


def event(what: str = "gateway", step: str = "starting") -> ProgressEvent:
    return ProgressEvent.from_dict({"what": what, "step": step})


def test_a_listener_sees_only_the_events_after_it_subscribed_and_until_it_unsubscribed() -> None:
    hub = ProgressHub()
    seen: list[ProgressEvent] = []
    hub.emit(event("before"))
    unsubscribe = hub.subscribe(seen.append)
    hub.emit(event("during"))
    unsubscribe()
    unsubscribe()  # idempotent
    hub.emit(event("after"))
    assert [e.what for e in seen] == ["during"]


def test_every_listener_gets_every_event_in_order() -> None:
    hub = ProgressHub()
    first: list[str] = []
    second: list[str] = []
    hub.subscribe(lambda e: first.append(e.what))
    hub.subscribe(lambda e: second.append(e.what))
    for what in ("a", "b", "c"):
        hub.emit(event(what))
    assert first == second == ["a", "b", "c"]


def test_a_failing_listener_is_logged_and_the_others_still_get_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = ProgressHub()
    seen: list[str] = []

    def broken(_: ProgressEvent) -> None:
        raise ValueError("listener bug")

    hub.subscribe(broken)
    hub.subscribe(lambda e: seen.append(e.what))
    with caplog.at_level(logging.ERROR, logger="ipybox.progress"):
        hub.emit(event("gateway"))
    assert seen == ["gateway"]
    assert "listener bug" in caplog.text


def test_emit_to_no_listener_does_nothing_and_a_failing_one_does_not_raise() -> None:
    emit_to(None, event())

    def broken(_: ProgressEvent) -> None:
        raise RuntimeError("boom")

    emit_to(broken, event())


def test_a_part_is_timed_from_its_first_event_and_only_its_last_is_done() -> None:
    timer = PartTimer()
    starting = timer.event("server time", "connecting")
    generating = timer.event("server time", "generating")
    ready = timer.event("server time", "ready", "2 tools")
    assert not starting.done and not generating.done and starting.elapsed_s == 0
    assert ready.done and not ready.failed and ready.detail == "2 tools"
    assert ready.elapsed_s is not None and ready.elapsed_s >= generating.elapsed_s >= 0  # type: ignore[operator]
    failed = timer.event("server x", "failed", "exited with code 3")
    assert failed.done and failed.failed and failed.elapsed_s == 0


def test_a_part_that_starts_again_after_its_last_event_is_timed_afresh() -> None:
    timer = PartTimer()
    timer.event("gateway", "starting")
    timer.event("gateway", "ready")
    again = timer.event("gateway", "starting")
    assert again.elapsed_s == 0 and not again.done


def test_a_long_detail_is_clipped() -> None:
    clipped = PartTimer().event("server x", "failed", "e" * (MAX_DETAIL * 3))
    assert clipped.detail is not None and len(clipped.detail) == MAX_DETAIL and clipped.detail.endswith("...")


def test_events_round_trip_as_json_lines_tagged_progress() -> None:
    original = PartTimer().event(server_part("time"), "ready", "2 tools")
    line = original.to_json()
    assert "\n" not in line and line.startswith('{"kind":"progress"')
    assert ProgressEvent.from_json(line) == original
    assert original.what == "server time"
