"""`logging_to`: while a supervisor runs, ipybox's log goes to its state directory's `logs/supervisor.log`.

Contract: the log from INFO up is written escaped (`PrintableFormatter`: a server's stderr quoted in a
record can't reach a terminal that shows the file), never through a symlink a kernel planted
(`StateLogHandler`). The handler filters at INFO; the `ipybox` logger must let INFO through to reach it:
while any supervisor of this process logs, it is at INFO or below (lowered if it was above, and the level
it had before the first put back after the last, as their lifetimes may overlap). Nothing else in ipybox
sets its level: a library call that did (`CodeExecutor.start()`) silenced the log after an MCP session.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from ipybox.display_text import PrintableFormatter
from ipybox.running.state import StateLogHandler, StatePaths


@contextlib.contextmanager
def logging_to(paths: StatePaths) -> Iterator[None]:
    """While open, ipybox's log from INFO up goes to `paths.log`; see the module docstring."""
    handler = StateLogHandler(paths)
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger("ipybox")
    root.addHandler(handler)
    if _SupervisorLogs.open == 0:
        _SupervisorLogs.level_before = root.level
        if root.getEffectiveLevel() > logging.INFO:
            root.setLevel(logging.INFO)
    _SupervisorLogs.open += 1
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        _SupervisorLogs.open -= 1
        if _SupervisorLogs.open == 0:
            root.setLevel(_SupervisorLogs.level_before)


class _SupervisorLogs:
    """How many supervisors of this process log, and the `ipybox` logger's level before the first did."""

    open = 0
    level_before = logging.NOTSET
