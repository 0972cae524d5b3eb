"""`Reconciler`: keeps a running workspace in step with its `ipybox.toml` (and `.env`) while it is edited.

Each applied change does only what it needs: an added or edited server is (re)started and its package
under `mcptools/` generated, a removed or disabled one is stopped and its package removed, changed approval
rules go to the rule engine, and a changed kernel environment, sandbox or warm pool has running kernels
replaced (through `ReconcileHooks`, implemented by whoever runs the kernels). An edit that doesn't load
leaves the last good configuration running.

Output parsers (`mcpparse/<server>/<module>.py`, see `ipybox.mcp_apigen.parsers`) are generated into a
server's package whenever it is generated, and checked after it is written: by `ast` on the host (never
imported here), then, with `run_check`, by importing them in a fresh kernel (`ipybox.codeact.checks`). What
fails is reported in the server's `parser_errors` (`mcpparse/<server>/<module>.py:LINE:COL: message`); it
never fails the server, whose `run()`s work regardless. `watch()` also follows `mcpparse/`: a parser added,
edited or removed regenerates its server's package from the tools listed last (no reconnect), which bumps
the generation marker, so kernels import the package and the parser anew.

Parsers are kernel-written, so nothing waits for their check (a parser's import may sleep):
- Approval rules apply first and at once: a reload puts `[approval]` in effect under a lock of its own
  (`hooks.rules_changed` swaps the policy) before it waits for any server work; `reload_rules()` leaves
  the rest of the file to the background altogether (an `always` answer that wrote a rule).
- Servers are added, removed and generated under another lock, which a check never holds: the import in a
  kernel runs in a task of its own after the package is written (the server is `ready`, its `checking`
  lists the modules being checked), at most one per server (a newer generation cancels the older check),
  bounded by `check_timeout`. A parser whose check takes longer is disabled: its server's package is
  generated without it (no `run_parsed()`) and its `parser_errors` say so, and it is not checked again
  until its file's content changes (then once).

Lifecycle: the reconciler is a `Service` (`ipybox.lifecycle`). `apply`, `reload`, `regenerate_parsed`
and `watch` need it started (`async with reconciler:`; else a `RuntimeError` says so), since what they
leave in the background (parser checks, the servers' part of an edit) runs in its task group; `aclose()`
cancels that work and waits for it. `reload_rules` puts the rules in effect in any state (the rest of the
file only while it runs); `load()` and `status()` work in any state. `watch()` runs in its caller's task
(the supervisor spawns it in its own group) until cancelled.

Progress: with a `progress` listener, each server's steps are emitted as `ProgressEvent`s of the part
`server <name>` (`ipybox.progress`): `connecting` (its process starts and `initialize`, then `tools/list`:
`MCPServers.connection` does both, so `connecting` covers both), `listing tools` once its tool list is read,
`generating`, `checking parsers` (only when it has output parsers), then `ready` ("N tools") or `failed`
(the reason). Servers start concurrently, so the events of different servers interleave.

Example:
    ```python
    async with Reconciler(Path("my-workspace"), tool_server.servers, hooks) as reconciler:
        await reconciler.apply(reconciler.load())  # start-up: raises ConfigError on a bad file
        async with asyncio.TaskGroup() as group:
            group.create_task(reconciler.watch())  # then follow edits
            print(reconciler.status())
    ```
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import os
from collections.abc import Awaitable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ipybox.codeact.checks import RunCheck, run_check
from ipybox.config.changes import ConfigChanges, diff
from ipybox.config.errors import ConfigError, ConfigProblem
from ipybox.config.loading import CONFIG_FILE, load_config
from ipybox.config.policy_lint import lint_error, located_findings, tool_shapes
from ipybox.config.secrets import secrets_digest
from ipybox.config.workspace_config import WorkspaceConfig
from ipybox.lifecycle import Service, ServiceState, first_of
from ipybox.mcp_apigen.package import write_mcp_sources
from ipybox.mcp_apigen.parsers import (
    ParserProblem,
    discover_parsers,
    parser_file,
    parser_module,
    parsers_dir,
    read_parser,
    static_problems,
    unmatched_parsers,
)
from ipybox.mcp_client.placeholders import placeholder_digest
from ipybox.progress import PartTimer, Progress, ProgressStep, emit_to, server_part
from ipybox.reconcile.generations import Generations, delete_retired, retire_package
from ipybox.reconcile.status import MCPServerStatus, ReconcilerStatus
from ipybox.reconcile.watch import DOTENV_FILE, Snapshot, parser_edits, settled_edits
from ipybox.rules.lint import LintFinding, lint_rules

if TYPE_CHECKING:
    import mcp_types as types

    from ipybox.mcp_client.pool import MCPServers
    from ipybox.rules import ApprovalPolicy
    from ipybox.rules.provenance import ProvenanceSettings

logger = logging.getLogger("ipybox.reconcile.reconciler")

_KERNEL_ENV = "kernel.env"
_SECRETS = "secrets"
_RETRY_AFTER_WATCH_FAILURE = 1.0
CHECK_TIMEOUT = 60.0
"""Seconds a parser check in a fresh kernel may take (claiming the kernel included)."""


class ReconcileHooks(Protocol):
    """What the reconciler asks of the process running the workspace (`ipybox up`)."""

    async def rules_changed(self, policy: ApprovalPolicy) -> None:
        """`[approval]` changed (or is applied for the first time): decide tool calls by `policy` now."""

    async def provenance_changed(self, settings: ProvenanceSettings) -> None:
        """`[provenance]` changed (or is applied for the first time): label and match tool results by
        `settings` now (applied with the rules, under their lock)."""

    async def kernels_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        """The kernels' environment, sandbox or warm pool changed: replace running kernels with ones
        started from `config`. `reasons` are one line each, e.g. `kernel.warm_pool: 1 -> 2`."""

    async def network_changed(self, config: WorkspaceConfig, reasons: list[str]) -> None:
        """Only the sandbox's network policy changed (`ConfigChanges.network_changed`): make the running
        kernels' proxy filter by `config`'s from their next connection on, or replace the kernels when it
        can't. `reasons` are one line each, e.g. `sandbox.network.allowedDomains: [...] -> [...]`."""


class Reconciler(Service):
    """Applies a workspace's configuration to running MCP servers, generated packages, rules and kernels,
    and follows edits of `ipybox.toml` and `.env`.

    Args:
        workspace_dir: The workspace directory (holding `ipybox.toml`).
        servers: The tool server's MCP servers; the reconciler registers, starts and stops them.
        hooks: Called when approval rules or kernel settings change.
        quiet_period: Seconds the files must stay unchanged after an edit before they are reloaded.
        run_check: Executes code in a fresh kernel (see `ipybox.codeact.checks.RunCheck`): output parsers
            are then checked by importing them there. `None`: they are checked by `ast` only.
        check_timeout: Seconds a check in a kernel may take; a parser whose check takes longer is disabled
            until its file changes.
        progress: Called with each server's steps (see the module); may be set later as `progress`.

    Attributes:
        config: The last configuration that loaded (`None` before the first).
        error: Why the last load failed (`None` after a good one); its text is `file:line:column: reason`.

    Example:
        ```python
        async with Reconciler(workspace, servers, hooks) as reconciler:
            await reconciler.apply(reconciler.load())
            await reconciler.watch()  # until cancelled
        ```
    """

    def __init__(
        self,
        workspace_dir: Path,
        servers: MCPServers,
        hooks: ReconcileHooks,
        *,
        quiet_period: float = 0.15,
        run_check: RunCheck | None = None,
        check_timeout: float = CHECK_TIMEOUT,
        progress: Progress | None = None,
    ) -> None:
        super().__init__("reconciler")
        self.workspace_dir = Path(workspace_dir).resolve()
        self.servers = servers
        self.hooks = hooks
        self.quiet_period = quiet_period
        self.run_check = run_check
        self.check_timeout = check_timeout
        self.progress = progress
        self._timer = PartTimer()
        self.config: WorkspaceConfig | None = None
        self.error: ConfigError | None = None
        self._applied: WorkspaceConfig | None = None
        # Fixed by the first configuration applied: kernels are told this directory when they start.
        self._mcptools_dir: Path | None = None
        self._generations = Generations()
        self._servers: dict[str, MCPServerStatus] = {}
        self._digests: dict[str, str] = {}  # what each server's and the kernel env's ${VAR}s resolved to
        self._hook_errors: dict[str, str] = {}
        self._loaded: Snapshot | None = None  # the files' contents at the last load
        self._tools: dict[str, list[types.Tool]] = {}  # what each server listed when last generated
        self._configured = asyncio.Event()  # set once a configuration was applied (mcptools_dir known)
        # Servers and packages (held while servers start and generate, never while a parser is checked).
        self._apply_lock = asyncio.Lock()
        self._reload_lock = asyncio.Lock()  # loads and rule changes take turns (never held for servers)
        self._rules_lock = asyncio.Lock()
        self._rules: ApprovalPolicy | None = None  # the policy last handed to `hooks.rules_changed`
        self._provenance: ProvenanceSettings | None = None  # last handed to `hooks.provenance_changed`
        # Each server's running parser check (a task of the service's group).
        self._checks: dict[str, asyncio.Task[None]] = {}
        # Parsers whose check timed out, by (server, module): the sha256 of the file that did.
        self._disabled: dict[tuple[str, str], str] = {}

    @property
    def mcptools_dir(self) -> Path | None:
        """Where packages are generated (`None` until a configuration was applied)."""
        return self._mcptools_dir

    def load(self) -> WorkspaceConfig:
        """Load `ipybox.toml` (for start-up; `reload()` loads and applies).

        Raises:
            ConfigError: The file is missing or invalid; `config` stays the last good one.
        """
        snapshot, loaded = _read_config(self.workspace_dir)
        self._accept(snapshot, loaded)
        if isinstance(loaded, ConfigError):
            raise loaded
        return loaded

    async def reload(self) -> bool:
        """Load `ipybox.toml` again and apply it: its approval rules at once, then the rest (`apply`). A
        configuration that doesn't load is logged and kept in `error`, and the last good one keeps
        running.

        Returns:
            Whether it loaded (and was applied).

        Raises:
            RuntimeError: The reconciler is not running (see the module's "Lifecycle").
        """
        self._require_running()
        config = await self._load_rules()
        if config is None:
            return False
        await self._apply_servers(config)
        return True

    async def reload_rules(self) -> bool:
        """Load `ipybox.toml` again and put its approval rules in effect now, without waiting for servers:
        the rest of the file is applied in the background (as `reload` would). For a change that only
        writes rules (an `always` answer). A reconciler that is not running (not started yet, or closing)
        puts the rules in effect all the same and leaves the rest alone.

        Returns:
            Whether it loaded.
        """
        config = await self._load_rules()
        if config is None:
            return False
        if self.state in (ServiceState.STARTING, ServiceState.RUNNING):
            self._in_background(self._apply_servers(config), f"applying the edited {CONFIG_FILE}")
        else:
            logger.info(
                "the reconciler is %s: only the rules of %s were applied", self.state.value, CONFIG_FILE
            )
        return True

    async def _load_rules(self) -> WorkspaceConfig | None:
        """Load the files; a good configuration's rules are in effect when this returns. With `[approval]
        lint = "error"`, rules that do not fit the tools known now make the edit a bad one."""
        async with self._reload_lock:
            snapshot, loaded = await asyncio.to_thread(_read_config, self.workspace_dir)
            before = self.config
            config = self._accept(snapshot, loaded)
            if config is not None and config.approval.lint == "error" and config.approval != self._rules:
                findings = self.lint(config)
                if findings:
                    self.config = before
                    self.error = lint_error(config, findings)
                    logger.error("%s\n(the last good configuration keeps running)", self.error)
                    return None
            if config is not None:
                await self._apply_rules(config)
            return config

    def lint(self, config: WorkspaceConfig | None = None) -> list[LintFinding]:
        """What the rules of `config` (default: the one in effect) get wrong about the tools of the
        servers listed so far (`ipybox.rules.lint`); servers not listed yet are not judged."""
        config = config if config is not None else self.config
        if config is None:
            return []
        enabled = config.enabled_servers()
        known = {name: tool_shapes(self._tools[name]) for name in enabled if name in self._tools}
        return lint_rules(
            config.approval.rules, known, unknown=[name for name in enabled if name not in known]
        )

    async def _apply_rules(self, config: WorkspaceConfig) -> None:
        """Put the `[approval]` and `[provenance]` of `config` in effect (each only when it changed)."""
        async with self._rules_lock:
            policy, provenance = config.approval, config.provenance
            if self._provenance is None or self._provenance != provenance:
                self._provenance = provenance
                await self._run_hook("provenance_changed", self.hooks.provenance_changed(provenance))
            if self._rules is not None and self._rules == policy:
                return
            self._rules = policy
            await self._run_hook("rules_changed", self.hooks.rules_changed(policy))

    async def apply(self, config: WorkspaceConfig) -> ConfigChanges:
        """Apply `config`, doing only what differs from the configuration applied before.

        Changed approval rules reach `hooks.rules_changed` first, without waiting for anything else. Then
        the packages of removed (or disabled) servers go; then, concurrently, removed servers stop, added
        and changed ones are (re)started and generated (one failing does not hold back the others: see
        `status()`), and `hooks.kernels_changed` replaces kernels if their settings changed (or
        `hooks.network_changed` updates their proxy, if only the network policy did). Servers that
        failed to start before are tried again. Each package written or removed bumps the generation
        marker at once. Output parsers are checked in a kernel after this returns (`checked()`).

        Returns:
            What changed.

        Raises:
            RuntimeError: The reconciler is not running (see the module's "Lifecycle").
        """
        self._require_running()
        await self._apply_rules(config)
        return await self._apply_servers(config)

    async def _apply_servers(self, config: WorkspaceConfig) -> ConfigChanges:
        """`apply` but for the rules (in effect already)."""
        async with self._apply_lock:
            first = self._applied is None
            changes = self._changes(self._applied, config)
            self._applied = self.config = config
            if self._mcptools_dir is None:
                self._mcptools_dir = config.resolve(config.workspace.mcptools_dir)
                self._generations = Generations.read(self._mcptools_dir)
                self._configured.set()
            removed = list(changes.removed)
            if first:  # packages generated by an earlier run for servers gone since
                enabled = config.enabled_servers()
                removed += [name for name in self._generations.servers if name not in enabled]
            # Packages go at once; their servers stop while the others start.
            retired = self._retire_packages(removed)
            _log_changes(changes, config)
            restarted = set(changes.changed)
            work = [
                self._stop_removed(removed, retired),
                *(
                    self._generate(name, config.server_params(name), name in restarted)
                    for name in changes.to_generate
                ),
            ]
            if changes.kernels_changed:
                reasons = [*changes.kernel_reasons, *changes.network_reasons]
                work.append(self._run_hook("kernels_changed", self.hooks.kernels_changed(config, reasons)))
            elif changes.network_changed:
                reasons = list(changes.network_reasons)
                work.append(self._run_hook("network_changed", self.hooks.network_changed(config, reasons)))
            await asyncio.gather(*work)
            self._digests[_KERNEL_ENV] = placeholder_digest(config.kernel.env, os.environ, self._dotenv_path)
            if not (changes.kernels_changed and "kernels_changed" in self._hook_errors):
                # Else the kernels still run the secrets resolved before: the next apply tries again.
                self._digests[_SECRETS] = self._secrets_digest(config)
            return changes

    async def watch(self, stop_event: asyncio.Event | None = None) -> None:
        """Follow edits of `ipybox.toml` and `.env` until cancelled (or `stop_event` is set): reload after
        each burst of saves, once the files are quiet. Nothing raised while reloading ends the watch.
        Edits of output parsers are followed too (`watch_parsers`).

        Raises:
            RuntimeError: The reconciler is not running (see the module's "Lifecycle").

        Example:
            ```python
            async with asyncio.TaskGroup() as group:  # or a `Service`'s `spawn()`
                watcher = group.create_task(reconciler.watch())
                ...
                watcher.cancel()
            ```
        """
        self._require_running()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_config(stop_event))
            group.create_task(self.watch_parsers(stop_event))

    async def watch_parsers(self, stop_event: asyncio.Event | None = None) -> None:
        """Follow `mcpparse/` (next to `mcptools/`, made if missing) once a configuration was applied: a
        parser saved, added or removed regenerates its server's package from the tools it listed last and
        checks its parsers again. Nothing raised while regenerating ends the watch."""
        if stop_event is None:
            await self._configured.wait()
        else:
            await first_of(self._configured.wait(), stop_event.wait())
        if self._mcptools_dir is None:
            return  # stopped before a configuration was applied
        directory = parsers_dir(self._mcptools_dir)
        while stop_event is None or not stop_event.is_set():
            try:
                async for names in parser_edits(directory, quiet=self.quiet_period, stop_event=stop_event):
                    await self.regenerate_parsed(names)
                return
            except Exception:
                logger.exception(
                    "watching %s failed: watching again in %s s", directory, _RETRY_AFTER_WATCH_FAILURE
                )
                await asyncio.sleep(_RETRY_AFTER_WATCH_FAILURE)

    async def regenerate_parsed(self, names: Iterable[str]) -> list[str]:
        """Regenerate the packages of `names` (servers whose parsers changed) from the tools each listed
        when last generated, and check their parsers again. Servers that are not ready (or unknown) are
        left alone: their next generation finds the parsers anyway.

        Returns:
            The servers regenerated.

        Raises:
            RuntimeError: The reconciler is not running (see the module's "Lifecycle").
        """
        self._require_running()
        done: list[str] = []
        async with self._apply_lock:
            for name in sorted(set(names)):
                status = self._servers.get(name)
                if status is None or status.state != "ready" or name not in self._tools:
                    continue
                logger.info("output parsers of %r changed: regenerating its package", name)
                if await self._publish(name, self._tools[name], status.tools, status.generation):
                    done.append(name)
        return done

    async def _watch_config(self, stop_event: asyncio.Event | None) -> None:
        while stop_event is None or not stop_event.is_set():
            try:
                async for snapshot in settled_edits(
                    self.workspace_dir, quiet=self.quiet_period, stop_event=stop_event
                ):
                    await self._on_edit(snapshot)
                return  # stop_event was set
            except Exception:
                logger.exception(
                    "watching %s failed: watching again in %s s",
                    self.workspace_dir,
                    _RETRY_AFTER_WATCH_FAILURE,
                )
                await asyncio.sleep(_RETRY_AFTER_WATCH_FAILURE)

    def status(self) -> ReconcilerStatus:
        """The reconciler's state, typed (`ipybox.reconcile.status`; each server's `location` and `stopped`
        are left for the supervisor to add).

        Example:
            ```python
            ReconcilerStatus(
                generation=4,
                servers={
                    "time": MCPServerStatus(
                        state="ready",
                        tools=2,
                        generation=4,
                        parsers=["get_current_time"],  # modules with an output parser
                        parser_errors=[],  # or "mcpparse/time/get_current_time.py:3:9: NameError: …"
                        checking=[],  # modules whose parser is being imported in a kernel now
                    )
                },
                error=None,  # or "…/ipybox.toml:12:1: unknown key 'comand' in [servers.time] (…)"
                hook_errors={},
                mcptools_dir="/work/ws/mcptools",
            )
            ```
        """
        config = self.config
        return ReconcilerStatus(
            generation=self._generations.generation,
            servers=dict(sorted(self._servers.items())),
            error=str(self.error) if self.error is not None else None,
            hook_errors=dict(self._hook_errors),
            mcptools_dir=str(self._mcptools_dir) if self._mcptools_dir is not None else None,
            lint=located_findings(config, self.lint(config)) if config is not None else [],
        )

    async def checked(self) -> None:
        """Wait until no output parser is being checked (each check is bounded by `check_timeout`)."""
        while self._checks:
            await asyncio.wait(list(self._checks.values()))

    def _require_running(self) -> None:
        if self.state in (ServiceState.STARTING, ServiceState.RUNNING):
            return
        if self.state is ServiceState.NEW:
            raise RuntimeError(
                "the reconciler is not started: start it first (`async with reconciler:`), its parser checks "
                "and background applies run in its task group"
            )
        raise RuntimeError(f"the reconciler is {self.state.value}: it applies nothing more")

    def _in_background(self, work: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[None]:
        """Run `work` in the service's group; it reports its own failure (logged) rather than failing the
        group, which would cancel the other checks and applies."""

        async def run() -> None:
            try:
                await work
            except Exception:
                logger.exception("%s failed", what)

        try:
            return self.spawn(run(), name=f"ipybox-reconcile: {what}")
        except RuntimeError:
            work.close()  # it never runs: closed, so it is not reported as never awaited
            raise

    async def _on_edit(self, snapshot: Snapshot) -> None:
        if snapshot == self._loaded:
            return  # a later event of a burst that was applied already
        failed = any(status.state == "failed" for status in self._servers.values())
        if snapshot.same_contents(self._loaded) and not failed:
            self._loaded = snapshot
            return  # saved again unchanged: only servers that failed would be tried again
        # The rules now; servers and kernels in the background, so that the next edit's rules never wait
        # for them (applies take turns, in the order of the edits).
        try:
            config = await self._load_rules()
        except Exception:
            logger.exception("applying the edited %s failed: still watching", CONFIG_FILE)
            return
        if config is not None:
            self._in_background(self._apply_servers(config), f"applying the edited {CONFIG_FILE}")

    def _accept(self, snapshot: Snapshot, loaded: WorkspaceConfig | ConfigError) -> WorkspaceConfig | None:
        """Record a load: the configuration if it is good, else the error (logged)."""
        self._loaded = snapshot
        if isinstance(loaded, ConfigError):
            self.error = loaded
            logger.error("%s\n(the last good configuration keeps running)", loaded)
            return None
        if self.error is not None:
            logger.info("%s loads again", loaded.path)
        self.error = None
        self.config = loaded
        return loaded

    def _changes(self, old: WorkspaceConfig | None, new: WorkspaceConfig) -> ConfigChanges:
        """`diff()`, plus what the files alone don't show: `${VAR}`s that resolve to new values (a `.env`
        edit), and servers that failed before (tried again)."""
        changes = diff(old, new)
        if old is None:
            return changes
        enabled = new.enabled_servers()
        changed = set(changes.changed)
        for name in enabled.keys() - set(changes.added) - changed:
            status = self._servers.get(name)
            failed = status is not None and status.state == "failed"
            if failed or self._server_digest(new.server_params(name)) != self._digests.get(name, ""):
                changed.add(name)
        kernel_reasons = list(changes.kernel_reasons)
        env_digest = placeholder_digest(new.kernel.env, os.environ, self._dotenv_path)
        edited_env = any(reason.startswith(_KERNEL_ENV) for reason in kernel_reasons)
        if not edited_env and env_digest != self._digests.get(_KERNEL_ENV, ""):
            kernel_reasons.insert(
                0, f"{_KERNEL_ENV}: a ${{VAR}} now has another value (in {DOTENV_FILE} or the environment)"
            )
        edited_secrets = any(reason.startswith(_SECRETS) for reason in kernel_reasons)
        if not edited_secrets and self._secrets_digest(new) != self._digests.get(_SECRETS, ""):
            kernel_reasons.append(
                f"{_SECRETS}: a ${{VAR}} now has another value (in {DOTENV_FILE} or the environment), or "
                "they were not resolved last time"
            )
        return dataclasses.replace(
            changes, changed=tuple(sorted(changed)), kernel_reasons=tuple(kernel_reasons)
        )

    def _secrets_digest(self, config: WorkspaceConfig) -> str:
        return secrets_digest(config.secrets, environ=os.environ, dotenv_path=self._dotenv_path)

    @property
    def _dotenv_path(self) -> Path:
        return self.workspace_dir / DOTENV_FILE

    def _server_digest(self, params: dict[str, Any]) -> str:
        # Resolved as `MCPServers` resolves them when it starts the server.
        environ = self.servers.environ if self.servers.environ is not None else os.environ
        return placeholder_digest(params, environ, self.servers.dotenv_path)

    async def _generate(self, name: str, params: dict[str, Any], restart: bool) -> None:
        assert self._mcptools_dir is not None
        self.servers.register(name, params)
        if restart:
            # Registered first, stopped second: a call racing with the stop starts the new parameters.
            await self.servers.stop(name)
        self._digests[name] = self._server_digest(params)
        before = self._servers.get(name)
        generation = self._generations.servers.get(name)
        tools = before.tools if before is not None else None
        self._servers[name] = MCPServerStatus(state="starting", tools=tools, generation=generation)
        self._emit(name, "connecting")
        try:
            await self.servers.connection(name)
        except Exception as e:
            self._failed(name, e, tools, generation)
            return
        listed = self.servers.tools(name)
        self._emit(name, "listing tools", f"{len(listed)} tools")
        await self._publish(name, listed, tools, generation)

    async def _publish(
        self, name: str, listed: list[types.Tool], tools: int | None, generation: int | None
    ) -> bool:
        """Write the package of `name` from the tools it `listed` (with the parsers found now, less the
        disabled ones), mark the change and check the parsers by `ast`; the server is then `ready`, and
        the parsers that parse are imported in a kernel in the background (`_check_in_kernel`). Returns
        whether the package was written."""
        assert self._mcptools_dir is not None
        root = self._mcptools_dir
        before = self._servers.get(name)
        self._servers[name] = (before or MCPServerStatus(state="starting")).model_copy(
            update={"state": "starting", "error": None, "checking": []}
        )
        self._cancel_check(name)
        self._emit(name, "generating")
        try:
            found = await asyncio.to_thread(discover_parsers, root, name)
            digests = await asyncio.to_thread(_parser_digests, root, name, found)
            disabled = {m for m in found if self._disabled.get((name, m), "") == digests[m]}
            parsers = found - disabled
            modules = await asyncio.to_thread(write_mcp_sources, name, listed, root, parsers)
        except Exception as e:
            self._failed(name, e, tools, generation)
            return False
        for module in found:
            if module not in disabled:
                self._disabled.pop((name, module), None)  # changed since: checked again
        self._tools[name] = listed
        generation = self._generations.bump(changed=[name])
        self._write_generations()
        parsed = sorted(parsers & set(modules))
        logger.info(
            "generated %s (%d tools%s)",
            root / name,
            len(modules),
            f", parsers: {', '.join(parsed)}" if parsed else "",
        )
        if parsed:
            self._emit(name, "checking parsers", f"{len(parsed)} parser{'s' * (len(parsed) != 1)}")
        errors, to_import = await self._static_check(name, parsed, unmatched_parsers(name, parsers, modules))
        errors += [self._disabled_line(name, module) for module in sorted(disabled & set(modules))]
        checking = to_import if self.run_check is not None else []
        self._servers[name] = MCPServerStatus(
            state="ready",
            tools=len(modules),
            generation=generation,
            parsers=parsed,
            parser_errors=errors,
            checking=checking,
        )
        if checking:
            task = self._in_background(
                self._check_in_kernel(name, generation, {m: digests[m] for m in checking}),
                f"checking the output parsers of {name!r}",
            )
            self._checks[name] = task
            task.add_done_callback(functools.partial(self._check_done, name))
        problems = f", {len(errors)} parser problem{'s' * (len(errors) != 1)}" if errors else ""
        self._emit(name, "ready", f"{len(modules)} tool{'s' * (len(modules) != 1)}{problems}")
        return True

    def _failed(self, name: str, error: Exception, tools: int | None, generation: int | None) -> None:
        reason = str(error) or type(error).__name__
        self._servers[name] = MCPServerStatus(
            state="failed", tools=tools, generation=generation, error=reason
        )
        logger.error("MCP server %r: no tools generated: %s", name, reason)
        self._emit(name, "failed", reason)

    def _emit(self, name: str, step: ProgressStep, detail: str | None = None) -> None:
        emit_to(self.progress, self._timer.event(server_part(name), step, detail))

    async def _static_check(
        self, name: str, parsed: list[str], problems: list[ParserProblem]
    ) -> tuple[list[str], list[str]]:
        """Check the parsers of `name`'s modules `parsed` by `ast` here: the problems' lines, and the
        modules whose parser parses (to import in a kernel)."""
        assert self._mcptools_dir is not None
        root = self._mcptools_dir
        errors = [self._located(p) for p in problems]
        to_import: list[str] = []
        for module in parsed:
            found = await asyncio.to_thread(static_problems, root, name, module)
            errors += [self._located(p) for p in found]
            if not found:
                to_import.append(module)
        for line in errors:
            logger.warning("output parser of %r: %s", name, line)
        return errors, to_import

    def _check_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._checks.get(name) is task:
            del self._checks[name]

    def _cancel_check(self, name: str) -> None:
        task = self._checks.pop(name, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # its result would be of an older package; the kernel goes back (deleted)

    async def _check_in_kernel(self, name: str, generation: int, digests: dict[str, str | None]) -> None:
        """Import the parsers of `name`'s modules (`digests`: each file's sha256) in a fresh kernel, off
        the apply path, and add what fails to the server's `parser_errors` if its package is still the one
        of `generation`. Parsers whose import outlasts `check_timeout` are disabled: the package is
        generated again without them."""
        assert self._mcptools_dir is not None
        errors, timed_out = await self._import_parsers(name, sorted(digests))
        for line in errors:
            logger.warning("output parser of %r: %s", name, line)
        for module in timed_out:
            digest = digests[module]
            if digest is not None:  # a file that can't be read now is checked again when it can
                self._disabled[name, module] = digest
            logger.warning("output parser of %r: %s", name, self._disabled_line(name, module))
        status = self._servers.get(name)
        if status is None or status.generation != generation:
            return
        if not timed_out:
            self._servers[name] = status.model_copy(
                update={"parser_errors": [*status.parser_errors, *errors], "checking": []}
            )
            return
        # Its package without them (this task is the server's check until then: `_publish` spares it).
        async with self._apply_lock:
            status = self._servers.get(name)
            if status is not None and status.generation == generation and name in self._tools:
                await self._publish(name, self._tools[name], status.tools, status.generation)

    async def _import_parsers(self, name: str, modules: list[str]) -> tuple[list[str], list[str]]:
        """Import the parsers of `modules` in one fresh kernel: the problems' lines, and the modules whose
        import took longer than `check_timeout` (when the kernel as a whole did, each is imported again in
        a kernel of its own, so one parser that hangs does not take the others with it)."""
        assert self._mcptools_dir is not None and self.run_check is not None
        root = self._mcptools_dir
        try:
            report = await asyncio.wait_for(
                run_check(self.run_check, [parser_module(name, m) for m in modules], root=root.parent),
                self.check_timeout,
            )
        except TimeoutError:
            if len(modules) == 1:
                return [], modules
            errors: list[str] = []
            timed_out: list[str] = []
            for module in modules:
                more, slow = await self._import_parsers(name, [module])
                errors += more
                timed_out += slow
            return errors, timed_out
        except Exception as e:
            logger.warning("could not check the output parsers of %r in a kernel: %s", name, e)
            where = self._display(parsers_dir(root) / name)
            return [f"{where}: not checked in a kernel: {e}"], []
        errors = []
        for problem in report.problems[:_MAX_PROBLEMS]:
            module = problem.module.rpartition(".")[2]
            expected = parser_file(name, module)
            if problem.path is None or problem.path.replace(os.sep, "/").endswith(expected):
                # Where the kernel saw the file need not be where the host does (a sandbox's view).
                problem = dataclasses.replace(problem, path=str(root.parent / expected))
            # Else it is in a module the parser imports, shown where the kernel saw it. The report is the
            # kernel's (code a parser runs can print one): its lines are kept short.
            errors.append(_clip(problem.describe(relative_to=self.workspace_dir)))
        return errors, []

    def _disabled_line(self, name: str, module: str) -> str:
        assert self._mcptools_dir is not None
        where = self._display(self._mcptools_dir.parent / parser_file(name, module))
        return (
            f"{where}: disabled: importing it in a kernel took longer than {self.check_timeout:g} s, so "
            "run_parsed() is left out; it is checked again when the file changes"
        )

    def _located(self, problem: ParserProblem) -> str:
        """`problem` with its path shown relative to the workspace (it is relative to `mcptools/`'s
        parent)."""
        assert self._mcptools_dir is not None
        path = self._display(self._mcptools_dir.parent / problem.path)
        return str(dataclasses.replace(problem, path=path))

    def _display(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.workspace_dir))
        except ValueError:
            return str(path)

    def _retire_packages(self, names: list[str]) -> list[Path]:
        """Move the packages of `names` out of the import path and mark the change; returns where they
        went, for `_stop_removed` to delete."""
        if not names:
            return []
        retired = [path for name in names if (path := self._retire(name)) is not None]
        for name in names:
            self._cancel_check(name)
            self._servers.pop(name, None)
            self._digests.pop(name, None)
            self._tools.pop(name, None)
        if retired or any(name in self._generations.servers for name in names):
            self._generations.bump(removed=names)
            self._write_generations()
        logger.info("removed MCP servers: %s", ", ".join(names))
        return retired

    async def _stop_removed(self, names: list[str], retired: list[Path]) -> None:
        stops = [self.servers.unregister(name) for name in names]
        deletions = [asyncio.to_thread(delete_retired, path) for path in retired]
        results = await asyncio.gather(*stops, *deletions, return_exceptions=True)
        for name, result in zip(names, results, strict=False):
            if isinstance(result, Exception):
                logger.warning("MCP server %r did not stop cleanly: %s", name, result)

    def _retire(self, name: str) -> Path | None:
        assert self._mcptools_dir is not None
        try:
            return retire_package(self._mcptools_dir, name)
        except OSError as e:
            logger.error("could not remove the package %s: %s", self._mcptools_dir / name, e)
            return None

    def _write_generations(self) -> None:
        assert self._mcptools_dir is not None
        try:
            self._generations.write(self._mcptools_dir)
        except OSError as e:
            # Kernels then keep the modules they imported until the next change is marked.
            logger.error("could not write the generation marker in %s: %s", self._mcptools_dir, e)

    async def _run_hook(self, name: str, call: Awaitable[None]) -> None:
        try:
            await call
        except ConfigError as e:
            # The hook refused the edit (a secret that does not resolve, the sandbox turned off under
            # --sandbox): shown as an edit that does not load, with the last good kernels still running.
            self._hook_errors[name] = f"{type(e).__name__}: {e}"
            self.error = e
            logger.error("%s\n(the last good configuration keeps running)", e)
        except Exception as e:
            self._hook_errors[name] = f"{type(e).__name__}: {e}"
            logger.exception("the %s hook failed", name)
        else:
            self._hook_errors.pop(name, None)


# What a kernel reports is kept within bounds: code a parser runs at import can print a report of its own.
_MAX_PROBLEMS = 50
_MAX_PROBLEM_CHARS = 1000


def _parser_digests(root: Path, server_name: str, modules: Iterable[str]) -> dict[str, str | None]:
    """The sha256 of each parser's file (`None` when it can't be read)."""
    digests: dict[str, str | None] = {}
    for module in modules:
        try:
            digests[module] = hashlib.sha256(read_parser(root, server_name, module)).hexdigest()
        except (OSError, ValueError):
            digests[module] = None
    return digests


def _clip(line: str) -> str:
    return line if len(line) <= _MAX_PROBLEM_CHARS else line[: _MAX_PROBLEM_CHARS - 3] + "..."


def _read_config(workspace_dir: Path) -> tuple[Snapshot, WorkspaceConfig | ConfigError]:
    # The snapshot is taken first: an edit landing while loading is a newer snapshot, so it is loaded too.
    snapshot = Snapshot.read(workspace_dir)
    path = workspace_dir / CONFIG_FILE
    try:
        return snapshot, load_config(path)
    except ConfigError as e:
        return snapshot, e
    except Exception as e:
        # A loader bug must not take the running workspace down: report it like any bad configuration.
        logger.exception("loading %s failed unexpectedly", path)
        return snapshot, ConfigError(
            path, [ConfigProblem(str(path), None, None, f"could not be loaded: {e!r}")]
        )


def _log_changes(changes: ConfigChanges, config: WorkspaceConfig) -> None:
    for reason in changes.restart_reasons:
        logger.warning("%s: takes effect when `ipybox up` restarts", reason)
    if changes.kernel_timeout_changed:
        logger.info("kernel.timeout is now %s s", config.kernel.timeout)
    for label, names in (("adding", changes.added), ("restarting", changes.changed)):
        if names:
            logger.info("%s MCP servers: %s", label, ", ".join(names))
