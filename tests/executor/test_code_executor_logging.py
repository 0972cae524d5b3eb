"""`CodeExecutor` and the `ipybox` logger: the logger's level is the application's; an executor's
`log_level` applies to what the executor starts, never to loggers it does not own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.running.state import NotRunningError


@pytest.fixture
def ipybox_logger_at_info() -> Iterator[logging.Logger]:
    logger = logging.getLogger("ipybox")
    level = logger.level
    logger.setLevel(logging.INFO)  # as an application (`ipybox up`) sets it
    yield logger
    logger.setLevel(level)


async def test_starting_an_executor_leaves_the_ipybox_logger_level_as_the_application_set_it(
    ipybox_logger_at_info: logging.Logger, tmp_path: Path
) -> None:
    # Attaching to a workspace where nothing runs fails at once, after everything `start()` does first.
    executor = CodeExecutor(workspace=tmp_path, log_level="ERROR")
    with pytest.raises(NotRunningError):
        await executor.start()
    assert ipybox_logger_at_info.level == logging.INFO
