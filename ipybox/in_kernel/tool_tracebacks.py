"""Tracebacks of failed tool calls end at the user's code (IPython's traceback formatter, wrapped).

A tool call that fails in the kernel (a rejected call, `ApprovalRejectedError`; a tool error or an
unreachable server, `ToolRunnerError`; `ApprovalTimeoutError`) is raised by the tool runner, two calls
below the generated tool module's `run()`. Shown as it is, its traceback ends in three frames of ipybox's
code (the generated `run()`, `ToolRunner.run_sync`, `ToolRunner._request`; with `arun()` also asyncio's
thread hand-off), which say nothing to the person or agent reading it and bury the line that made the call.

`install(shell)` wraps the shell's `InteractiveTB.structured_traceback` (once per shell): before a traceback
is formatted, it is cut in place just above the first frame of a generated tool module or of the tool
runner, if the exception was raised in the tool runner (its innermost frame is there) and some frame of the
user's is above. The exception's type, message and attributes (`rule_id`, `reason`, ...) stay as they are,
and so do the tracebacks it chains to (each cut the same way). The rendered traceback then ends at the
user's line (`----> 2 echo.run(echo.Params(...))`). Not cut:

- an error raised elsewhere below a generated module: an output parser's (`run_parsed()` runs
  agent-written code, whose frames are worth seeing), or pydantic's validation of a tool's result;
- a traceback with nothing of the user's above the tool-call frames (left whole rather than emptied).

Why not IPython's `__tracebackhide__`: IPython 9 still shows the frame an exception was raised in, and adds
"[... skipping hidden N frame]"; nor `raise ... from None` in `run()`: the frame that raises is always
shown. `shell_approval` cuts its own hooks' frames the same way.

The tool runner calls `install` when it first finds IPython's shell (its first tool call); outside IPython
(a plain script) nothing is installed, and Python's own traceback stays whole.

Runs inside kernels: standard library only.
"""

from __future__ import annotations

import functools
from types import FrameType, TracebackType
from typing import Any

_HOOKED = "_ipybox_tool_tracebacks"
_RUNNER = "ipybox.in_kernel.tool_runner"
# The names every generated tool module defines, and its functions that call the tool runner
# (`ipybox/mcp_apigen/templates/tool_module.py.jinja`). Both: a cell that star-imported a tool module has
# the names in its globals too, and its own frame must never count as the tool call's.
_GENERATED = ("SERVER_NAME", "TOOL_NAME", "PACKAGE_ROOT")
_CALLERS = frozenset({"run", "arun", "run_parsed", "arun_parsed"})


def install(shell: Any) -> None:
    """Have `shell` (IPython's) show tool-call tracebacks without ipybox's frames; idempotent."""
    formatter: Any = getattr(shell, "InteractiveTB", None)
    original = getattr(formatter, "structured_traceback", None)
    if original is None or getattr(original, _HOOKED, False):
        return

    @functools.wraps(original)
    def structured_traceback(etype: Any, evalue: Any, etb: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            cut_tool_frames(etb)
            seen: set[int] = set()
            chained = evalue
            while isinstance(chained, BaseException) and id(chained) not in seen:
                seen.add(id(chained))
                cut_tool_frames(chained.__traceback__)
                chained = chained.__cause__ or (None if chained.__suppress_context__ else chained.__context__)
        except Exception:  # never let showing a traceback fail: shown whole then
            pass
        return original(etype, evalue, etb, *args, **kwargs)

    setattr(structured_traceback, _HOOKED, True)
    formatter.structured_traceback = structured_traceback


def cut_tool_frames(tb: TracebackType | None) -> bool:
    """Cut `tb` in place above its tool-call frames (see the module); whether it was cut."""
    entries: list[TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if not entries or _module(entries[-1].tb_frame) != _RUNNER:
        return False  # not raised by the tool runner
    for index, entry in enumerate(entries):
        if _is_tool_call(entry.tb_frame):
            if index == 0:
                return False  # nothing of the user's above it
            entries[index - 1].tb_next = None
            return True
    return False


def _module(frame: FrameType) -> object:
    return frame.f_globals.get("__name__")


def _is_tool_call(frame: FrameType) -> bool:
    if _module(frame) == _RUNNER:
        return True
    names = frame.f_globals
    return frame.f_code.co_name in _CALLERS and all(name in names for name in _GENERATED)
