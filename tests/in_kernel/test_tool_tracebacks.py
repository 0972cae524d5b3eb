"""`ipybox.in_kernel.tool_tracebacks.cut_tool_frames` on real tracebacks of code standing in for the tool
runner and a generated tool module (the rendering in a real kernel is tested in
tests/executor/test_code_executor_tools.py): a failure raised by the tool runner is cut above the generated
module's frame; a failure raised elsewhere below it (an output parser's) and a caller whose globals merely
hold a tool module's names are left alone."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

from ipybox.in_kernel.tool_tracebacks import cut_tool_frames

GENERATED_NAMES = {"SERVER_NAME": "edge", "TOOL_NAME": "echo", "PACKAGE_ROOT": None}


def _module(name: str, source: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name, **names}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace


RUNNER = _module("ipybox.in_kernel.tool_runner", "def _request():\n    raise RuntimeError('rejected')\n")
GENERATED = _module(
    "mcptools.edge.echo",
    "def run():\n    return _request()\n\ndef run_parsed():\n    return parse()\n",
    _request=RUNNER["_request"],
    parse=lambda: 1 / 0,
    **GENERATED_NAMES,
)


def _traceback_of(call: Callable[[], Any]) -> TracebackType:
    try:
        call()
    except Exception as e:
        assert e.__traceback__ is not None
        return e.__traceback__
    raise AssertionError("did not raise")


def _names(tb: TracebackType | None) -> list[str]:
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def users_code() -> Any:
    return GENERATED["run"]()


def test_a_failure_raised_by_the_tool_runner_ends_at_the_callers_frame() -> None:
    tb = _traceback_of(users_code)
    assert _names(tb)[-3:] == ["users_code", "run", "_request"]
    assert cut_tool_frames(tb)
    assert _names(tb) == ["_traceback_of", "users_code"]


def test_a_parsers_failure_below_a_generated_module_keeps_its_frames() -> None:
    tb = _traceback_of(lambda: GENERATED["run_parsed"]())
    assert not cut_tool_frames(tb)
    assert _names(tb)[-2:] == ["run_parsed", "<lambda>"]


def test_a_caller_holding_a_tool_modules_names_is_not_taken_for_it() -> None:
    # As a cell that did `from mcptools.edge.echo import *`: its frame stays, the generated one goes.
    cell = _module("__main__", "def cell():\n    return run()\n", run=GENERATED["run"], **GENERATED_NAMES)
    tb = _traceback_of(cell["cell"])
    assert cut_tool_frames(tb)
    assert _names(tb) == ["_traceback_of", "cell"]


def test_nothing_of_the_callers_above_leaves_the_traceback_whole() -> None:
    try:
        RUNNER["_request"]()
    except RuntimeError as e:
        tb = e.__traceback__
    assert tb is not None
    inner = tb.tb_next  # the runner's frame alone
    assert inner is not None and not cut_tool_frames(inner) and _names(inner) == ["_request"]
