"""Warming a kernel up before it is handed out: what the first tool call in it needs is imported already.

A generated tool module (`ipybox.mcp_apigen`) imports pydantic, defines its models and calls
`ipybox.tool_exec.client.ToolRunner`. In a fresh kernel that is 150-600 ms (pydantic's import and its
first schema build are most of it), against a few milliseconds for the call itself. A kernel that waits to
be handed out (a workspace's warm pool, an executor's spare) spends that time beforehand instead:
`warm_up()` runs `WARM_UP_STEPS` in it: the tool runner's imports, pydantic's in a few steps, then models
shaped like the generated ones, built and used; the first of them also runs IPython's first-cell path.

Contract:

- The warm-up is invisible to the code that later runs in the kernel: each step is a *silent* execution
  (no execution count, no history, no `pre_run_cell`/`post_run_cell` hooks, nothing on iopub but its own
  busy/idle status, which no later request's output is confused with), runs in a namespace of its own (the
  user's namespace gets no name) with `stop_on_error` off, and swallows every error of its own (a kernel
  whose interpreter lacks pydantic or ipybox warms up what it has). Only `sys.modules` differs: that is
  the point.
- It never imports the user's generated packages (`mcptools`): they change while kernels run, and
  `ipybox.in_kernel.mcptools_refresh` must import each version fresh.
- It never delays a kernel that is wanted: the shell runs one request at a time, so a step in progress
  delays the first request of whoever takes the kernel. `go_on()` is asked before each step; once it says
  no, the warm-up ends, so whoever takes a warming kernel waits for one step at most (tens of
  milliseconds). The pool skips the warm-up of a kernel a claim already waits for.
- `warm_up()` never raises but the caller's cancellation (a failed warm-up leaves a kernel that works,
  only colder); it returns whether the kernel is still alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ipybox.kernels.kernel_connection import KernelConnection, KernelDied

logger = logging.getLogger(__name__)

WARM_UP_TIMEOUT = 30.0
"""Seconds the warm-up may take; a kernel still busy after that is kept (it answers once it is done)."""

# Imports `names` in order, each one's failure ignored.
_IMPORTS = """
import importlib

for name in {names!r}:
    try:
        importlib.import_module(name)
    except Exception:
        pass
"""

# The models follow a generated module: deferred annotations, `BaseModel` with `ConfigDict`, `Field` with an
# alias and constraints, `Literal`, optional and nested fields, a `RootModel`, the standard-library types the
# generator imports (`datetime`, `uuid`), and `model_dump(mode="json", by_alias=True, exclude_unset=True)` /
# `model_validate`, as `run()` uses them. They are defined in a module object of their own (pydantic looks
# a model's module up in `sys.modules`), registered only while they are built.
_MODELS = """
from __future__ import annotations

import datetime as _datetime
import uuid as _uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel


class Item(BaseModel):
    model_config = ConfigDict(extra="allow", validate_by_name=True)
    item_name: str = Field(alias="itemName", min_length=1, description="a name")
    kind: Literal["a", "b"] = "a"
    count: int | None = Field(default=None, ge=0)
    tags: list[str] = Field(default_factory=list)


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    items: list[Item] | None = None
    meta: dict[str, Any] | None = None
    when: _datetime.datetime | None = None
    id: _uuid.UUID | None = None
    ratio: float = 1.0
    flag: bool = False


class Rows(RootModel[list[dict[str, Any]]]):
    pass


params = Params(text="x", items=[Item(itemName="n", count=1)], when=_datetime.datetime(2000, 1, 1))
Params.model_validate(params.model_dump(mode="json", by_alias=True, exclude_unset=True))
Rows.model_validate([{"a": 1}]).model_dump()
"""

_BUILD = f"""
import sys
import types

module = types.ModuleType("__ipybox_warm_up__")
sys.modules[module.__name__] = module
try:
    exec({_MODELS!r}, module.__dict__)
except Exception:
    pass
finally:
    sys.modules.pop(module.__name__, None)
"""


def _cell(body: str) -> str:
    """A cell that runs `body` by `exec` in a namespace of its own, so the user's namespace gets no name."""
    return f"exec({body!r}, {{}})"


WARM_UP_STEPS: tuple[str, ...] = (
    _cell(
        _IMPORTS.format(
            names=(
                *("datetime", "json", "os", "select", "socket", "threading", "typing", "uuid"),
                "ipybox.tool_exec.client",
            )
        )
    ),
    _cell(_IMPORTS.format(names=("pydantic_core", "pydantic"))),
    _cell(_IMPORTS.format(names=("pydantic.fields", "pydantic.main"))),
    _cell(_IMPORTS.format(names=("pydantic.types", "pydantic.functional_validators", "pydantic.root_model"))),
    _cell(_BUILD),
)
"""The cells that warm a kernel up, in order (see the module docstring); each takes tens of milliseconds."""


async def warm_up(
    kernel: KernelConnection, go_on: Callable[[], bool] = lambda: True, timeout: float = WARM_UP_TIMEOUT
) -> bool:
    """Run `WARM_UP_STEPS` in `kernel`, each a silent execution waited for to its end (its reply and idle
    status), while `go_on()` says so before each step and for `timeout` seconds at most in all.

    Returns:
        Whether the kernel is alive afterwards (`False`: it died, or its connection was lost).
    """
    try:
        async with asyncio.timeout(timeout):
            for code in WARM_UP_STEPS:
                if not go_on():
                    break
                await _run_silently(kernel, code)
    except KernelDied:
        return False
    except TimeoutError:
        # Busy still (a very slow machine): the kernel is fine, whoever takes it waits for the step.
        logger.debug("the warm-up of kernel %s took over %g s", kernel.kernel_id, timeout)
    return not kernel.dead


def silent_execution(code: str) -> dict[str, Any]:
    """The `execute_request` content of a silent execution of `code`: no execution count, no history, no
    hooks. An error in it does not abort the requests queued behind it (the first cell of whoever took
    the kernel)."""
    return {
        "code": code,
        "silent": True,
        "store_history": False,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": False,
    }


async def _run_silently(kernel: KernelConnection, code: str) -> None:
    request = kernel.submit("execute_request", silent_execution(code))
    try:
        while not request.done:
            await request.next(None)
    finally:
        kernel.finish(request)
