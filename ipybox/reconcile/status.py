"""The reconciler's status, typed: `ReconcilerStatus` and each server's `MCPServerStatus`.

Contract:

- `Reconciler.status()` returns a `ReconcilerStatus`; the supervisor adds what only it knows (each
  server's `location` in `ipybox.toml`, why a server `stopped`) with `model_copy`, and serves it inside
  `ipybox.running.status.WorkspaceStatus`, which re-exports both models (the control protocol's module,
  where clients find them). Defined here, below both, so neither end re-validates a dict of the other.
- The models are frozen; extra keys are ignored when validating (a newer supervisor may report more than
  a client knows). Lists are never changed in place: a change is a new model (`model_copy(update=...)`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["MCPServerStatus", "ReconcilerStatus", "ServerState"]

ServerState = Literal["starting", "ready", "failed"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class MCPServerStatus(_Model):
    """Where one MCP server's generated package stands (see `Reconciler`).

    Attributes:
        state: `starting` (being started and generated, and its parsers checked), `ready` (package
            generated) or `failed` (it could not be started; a package from before stays).
        tools: Tools in its package; `None` when there is none (or it is not known).
        generation: The generation its package was written at; `None` when there is no package.
        error: Why it failed, when it did.
        parsers: Modules of its package with an output parser (`mcpparse/<server>/<module>.py`), sorted,
            whose `run_parsed()` returns the parser's `ParseResult`.
        parser_errors: Parsers that do not work, one line each: `mcpparse/<server>/<module>.py:LINE:COL:
            message` (relative to the workspace). They never fail the server: `run()` works. A parser
            whose check in a kernel took too long is disabled (left out of the package) and listed here.
        checking: Modules whose parser is being imported in a kernel now (a check runs in the background;
            its problems join `parser_errors` when it ends).
        location: Where its table starts, `ipybox.toml:LINE:COL` (`None` when not known; the supervisor
            adds it, the reconciler leaves it `None`).
        stopped: Why the server is not running now, when it ended by itself after it started (e.g. "MCP
            server 'x' went over its memory limit (limit 64 MiB, peak 64 MiB) and was stopped"); it
            starts again on its next call. `None` while it runs (the supervisor adds it, from the tool
            server).
    """

    state: ServerState
    tools: int | None = None
    generation: int | None = None
    error: str | None = None
    parsers: list[str] = []
    parser_errors: list[str] = []
    checking: list[str] = []
    location: str | None = None
    stopped: str | None = None


class ReconcilerStatus(_Model):
    """The reconciler's state (all empty before it applied a configuration).

    Attributes:
        generation: The generation marker of `mcptools/` (bumped by each package written or removed).
        servers: Each enabled server's package, by name (sorted).
        error: Why the last load of `ipybox.toml` failed (`file:line:column: reason`), `None` after a good
            one.
        hook_errors: The hooks (`rules_changed`, `kernels_changed`) whose last call failed, and why.
        mcptools_dir: Where packages are generated (`None` before a configuration was applied).
        lint: The rules in effect that do not fit the live tools, one line each (`ipybox.toml:LINE:COL:
            message`; see `[approval] lint`), judged against the servers whose tools are known.
    """

    generation: int = 0
    servers: dict[str, MCPServerStatus] = {}
    error: str | None = None
    hook_errors: dict[str, str] = {}
    mcptools_dir: str | None = None
    lint: list[str] = []
