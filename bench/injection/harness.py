"""Runs the injection scenarios through a real workspace: an in-process `Supervisor` (kernel gateway, warm
kernels, the tool server with the rules engine), our attacker server as `web`, `mail`, `tracker` and
`contacts` (tests/servers/attacker_server.py), and the real npm filesystem server as `files`.

Per scenario: the filesystem server's root is emptied and refilled (world.toml's files and the
scenario's), the attacker server's world and journal are rewritten, an application attaches
(`CodeExecutor(workspace=...)`: a fresh session on a warm kernel) and runs the scenario's cells one by one
with `stream()`. Every `ApprovalRequest` is rejected, as nobody answers in an unattended run (the
workspace's `[approval] ask = ["application"]`, so no person is asked instead); a cell that raises
(a refused call, or a name an earlier refused call never defined) does not stop the next cell. The
session's decisions are then read from the audit log (the lines written since the scenario started) and
paired with the scenario's declared calls (`model.match_calls`).

What ran is also checked against what the sinks saw: the attacker server's journal holds exactly the
calls of `web`, `mail` and `tracker` the audit log says were allowed, and a `files.write_file` the log
allowed left its file while a refused one left none. A mismatch is a harness problem reported with the
scenario (`ScenarioResult.problems`), never counted as stopped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.injection.model import (
    Configuration,
    Decision,
    Scenario,
    ScenarioResult,
    load_world,
    match_calls,
    policy_for,
)
from ipybox import ApprovalRequest, CodeExecutionError, CodeExecutionResult, CodeExecutor
from ipybox.limits import unenforceable_defaults
from ipybox.supervisor import Supervisor

REPO_ROOT = Path(__file__).resolve().parents[2]
ATTACKER_SERVER = REPO_ROOT / "tests" / "servers" / "attacker_server.py"
FILESYSTEM_SERVER = (
    REPO_ROOT
    / ".cache"
    / "npm"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-filesystem"
    / "dist"
    / "index.js"
)
ATTACKER_SERVICES = ("web", "mail", "tracker", "contacts")
CELL_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Lab:
    """The files of one evaluation workspace."""

    directory: Path

    @property
    def root(self) -> Path:  # the filesystem server's only allowed directory
        return self.directory / "fs-root"

    @property
    def world(self) -> Path:
        return self.directory / "eval" / "world.json"

    @property
    def journal(self) -> Path:
        return self.directory / "eval" / "journal.jsonl"


def servers_toml(lab: Lab, tag: str | None = None, servers: Collection[str] | None = None) -> str:
    """`[servers.*]` tables: the attacker server's four services and the npm filesystem server (or only
    those named in `servers`: each is started and generated when the workspace starts)."""
    if not FILESYSTEM_SERVER.exists():
        raise RuntimeError(f"{FILESYSTEM_SERVER} is missing: run `bash scripts/setup`")
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node not found: the filesystem server needs Node.js (see scripts/setup)")
    env = {"ATTACKER_CONTENT": str(lab.world), "ATTACKER_JOURNAL": str(lab.journal)}
    if tag is not None:
        env["IPYBOX_TEST_TAG"] = tag
    env_toml = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }"
    tables = [
        f"[servers.{service}]\ncommand = {json.dumps(sys.executable)}\n"
        f'args = [{json.dumps(str(ATTACKER_SERVER))}, "--service", "{service}"]\nenv = {env_toml}\n'
        for service in ATTACKER_SERVICES
        if servers is None or service in servers
    ]
    if servers is None or "files" in servers:
        tables.append(
            f"[servers.files]\ncommand = {json.dumps(node)}\n"
            f"args = [{json.dumps(str(FILESYSTEM_SERVER))}, {json.dumps(str(lab.root))}]\n"
            + (f'env = {{ IPYBOX_TEST_TAG = "{tag}" }}\n' if tag is not None else "")
        )
    return "\n".join(tables)


def workspace_toml(
    lab: Lab, policy: str, *, sandbox: bool, tag: str | None = None, servers: Collection[str] | None = None
) -> str:
    """A whole `ipybox.toml`: two warm kernels (the next scenario's is ready while the last one detaches),
    sandboxed or not, with the limits this machine can't enforce lifted as `ipybox init` lifts them; the
    servers; and `policy` (`[approval]`, `[provenance]`)."""
    lifted = unenforceable_defaults(sandboxed=sandbox)
    limits = "[kernel.limits]\n" + "".join(f'{n} = "unlimited"\n' for n in lifted) + "\n" if lifted else ""
    return (
        "[kernel]\nwarm_pool = 2\n\n"
        + limits
        + f"[sandbox]\nenabled = {str(sandbox).lower()}\n\n"
        + servers_toml(lab, tag, servers)
        + "\n"
        + policy
    )


def prepare(
    directory: Path,
    configuration: Configuration,
    *,
    sandbox: bool,
    tag: str | None = None,
    servers: Collection[str] | None = None,
) -> Lab:
    """Write the workspace for `configuration` into `directory` (created if needed), with every server or
    those named in `servers`."""
    lab = Lab(directory)
    lab.root.mkdir(parents=True, exist_ok=True)
    lab.world.parent.mkdir(parents=True, exist_ok=True)
    (directory / "ipybox.toml").write_text(
        workspace_toml(lab, policy_for(configuration), sandbox=sandbox, tag=tag, servers=servers)
    )
    return lab


def set_world(lab: Lab, scenario: Scenario) -> None:
    """The attacker server's world and the filesystem root as `scenario` starts them; an empty journal."""
    world, files = load_world(scenario.world)
    lab.world.write_text(json.dumps(world))
    lab.journal.write_text("")
    for entry in lab.root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for relative, text in {**files, **scenario.files}.items():
        path = lab.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def read_decisions(audit: Path, offset: int) -> list[Decision]:
    """The audit log's records from byte `offset` on."""
    with open(audit, "rb") as file:
        file.seek(offset)
        lines = file.read().decode().splitlines()
    decisions = []
    for line in lines:
        record: dict[str, Any] = json.loads(line)
        decisions.append(
            Decision(
                call=f"{record['server']}.{record['tool']}",
                decision=record["decision"],
                decided_by=record["decided_by"],
                rule_id=record.get("rule_id"),
                args=record.get("args") or {},
            )
        )
    return decisions


def check_sinks(lab: Lab, scenario: Scenario, decisions: Sequence[Decision]) -> list[str]:
    """Problems, if the sinks saw other calls than the audit log allowed (see the module docstring)."""
    problems = []
    journal = [json.loads(line) for line in lab.journal.read_text().splitlines() if line.strip()]
    seen = Counter(f"{entry['service']}.{entry['tool']}" for entry in journal)
    journaled = {"web.fetch_page", "web.http_post", "mail.send_email", "tracker.post_comment"}
    allowed = Counter(d.call for d in decisions if d.call in journaled and d.decision == "allow")
    if seen != allowed:
        problems.append(
            f"the attacker server's journal has {dict(seen)}, the audit log allowed {dict(allowed)}"
        )
    _, world_files = load_world(scenario.world)
    existing = {**world_files, **scenario.files}
    for d in decisions:
        if d.call != "files.write_file" or not isinstance(d.args.get("path"), str):
            continue
        path = lab.root / d.args["path"]
        if d.decision == "allow" and not path.exists():
            problems.append(f"write_file of {d.args['path']} was allowed but left no file")
        if d.decision == "deny" and d.args["path"] not in existing and path.exists():
            problems.append(f"write_file of {d.args['path']} was refused but the file exists")
    return problems


async def run_cells(workspace: Path, cells: Sequence[str]) -> tuple[list[str], CodeExecutor]:
    """Each cell in one fresh session, every ask rejected; each cell's text or error, and the executor,
    still attached (`CodeExecutor.stop()` it: a detach takes a second that the next scenario need not
    wait for, since every decision of this one is in the audit log when its last cell returns)."""
    outputs = []
    executor = CodeExecutor(workspace=workspace)
    await executor.start()
    try:
        for code in cells:
            text = ""
            try:
                async for item in executor.stream(code, timeout=CELL_TIMEOUT_S):
                    if isinstance(item, ApprovalRequest):
                        # Unattended: nobody answers, so the ask is a no.
                        await item.reject()
                    elif isinstance(item, CodeExecutionResult):
                        text = item.text or ""
            except CodeExecutionError as e:
                text = f"{e.ename}: {e.evalue}"
            outputs.append(text)
    except BaseException:
        await executor.stop()
        raise
    return outputs, executor


async def run_scenario(
    supervisor: Supervisor,
    lab: Lab,
    scenario: Scenario,
    configuration: str,
    detaching: list[asyncio.Task[None]] | None = None,
) -> ScenarioResult:
    """Run `scenario` in a fresh session of `supervisor`'s workspace. Its session is detached before this
    returns, or, with `detaching`, in a task appended there (await them before stopping the workspace)."""
    set_world(lab, scenario)
    started = time.perf_counter()
    audit = supervisor.paths.audit
    offset = audit.stat().st_size if audit.exists() else 0
    outputs, executor = await run_cells(supervisor.workspace, scenario.cells)
    wall_ms = (time.perf_counter() - started) * 1000
    if detaching is None:
        await executor.stop()
    else:
        detaching.append(asyncio.create_task(executor.stop()))
    decisions = read_decisions(audit, offset) if audit.exists() else []
    calls, unexpected = match_calls(scenario.calls, decisions)
    result = ScenarioResult(
        scenario, configuration, calls, unexpected, check_sinks(lab, scenario, decisions), outputs, wall_ms
    )
    if unexpected:
        result.problems.append(
            "calls the scenario does not declare: " + ", ".join(d.call for d in unexpected)
        )
    return result


async def run_configuration(
    directory: Path, configuration: Configuration, scenarios: Sequence[Scenario], *, sandbox: bool
) -> list[ScenarioResult]:
    """A workspace for `configuration` in `directory`, started, every scenario run in it, stopped."""
    lab = prepare(directory, configuration, sandbox=sandbox)
    supervisor = Supervisor(directory, serve_mcp=False)
    await supervisor.start()
    detaching: list[asyncio.Task[None]] = []
    try:
        return [await run_scenario(supervisor, lab, s, configuration.name, detaching) for s in scenarios]
    finally:
        await asyncio.gather(*detaching, return_exceptions=True)
        await supervisor.stop()
