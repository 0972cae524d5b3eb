"""Small helpers for applications built on ipybox."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def arun(func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking function in a worker thread and await its result.

    Example:
        ```python
        answer = await arun(input, "Approve? (Y/n): ")
        ```
    """
    return await asyncio.to_thread(functools.partial(func, *args, **kwargs))
