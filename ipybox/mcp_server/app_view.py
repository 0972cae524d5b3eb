"""The MCP App view of a cell's run (the MCP Apps extension, `io.modelcontextprotocol/ui`, SEP-1865).

A host that renders interactive UI shows `execute_ipython_cell` as its run: the cell's code, each tool call
its kernel made with the decision and the rule that decided, the output and the plots, and for a pending
`ask` buttons that decide the call that waits.

Negotiation: the server advertises the extension (`capabilities.extensions`); a client that declares it
with the `text/html;profile=mcp-app` MIME type (`client_supports_apps`) sees `execute_ipython_cell`'s
`_meta.ui.resourceUri` (`VIEW_URI`) and the two app-only tools (`_meta.ui.visibility: ["app"]`), and its
results carry `_meta[RUN_META]` (the run's id). Any other client gets today's tool list and today's
results, byte for byte (`tests/mcp_server/test_app_view.py`), and the app-only tools refuse it.

The view's capability (the security contract): app-only visibility is enforced by the host, not by us, and a
model may call any tool it is shown, so the tools that read a run and answer its asks require a *view key*
that only the rendered view holds:

- A key is minted by each `resources/read` of `VIEW_URI` and written into the HTML the host hands to the
  view; `resources/read` goes from the host to the view, never into the model's context, and no tool
  result's `content` ever holds a key. It is `<id>.<secret>` (secret: 256 random bits), bound to the MCP
  session that read it (`Owner`: the caller, as `ipybox.mcp_server.kernels.caller_of` tells it, and the
  handshake-era session); the secret is compared in constant time (`secrets.compare_digest`).
- A run and its asks belong to the session that ran the cell: a key of another session (or another
  caller) finds no run and answers nothing.
- A key answers an ask once; a second answer (with any key) is refused, and so is an answer to an ask
  that was settled elsewhere (a person at the console, the client's elicitation, the ask's timeout).
- An answer decides the waiting call through the same path as an elicitation answer of this MCP client:
  `ApprovalRequest.accept()`/`reject()` on the request the kernel's call waits on, which the workspace's
  approver puts on its board and writes into the audit log with the rule that asked. It counts as the
  `elicitation` route (`decided_by: "elicitation"`): the MCP client's own UI asked a person, as its
  elicitation dialog does. So `[approval] ask` governs it as it governs elicitation: a workspace that
  does not list `elicitation` never routes an ask to the MCP client, the view shows the ask, and its
  buttons say to answer at the console. Answers are `once`; "for this session" and "always" link to the
  web console, whose answers reach that far.
- A client that declares the extension can answer asks even without elicitation: its kernel's asks are
  routed to it (`CodeExecutor._ask_answers = "elicitation"`) and wait for the view, a person at the
  console, or `[approval] ask_timeout`.

The run's tool calls come from the audit log: the entries recorded since the run started whose `code` is
the hash of the cell's text (the kernel reports it with each call). Two sessions running the very same
text at the same moment would see each other's calls; nothing else would.

The view is one self-contained HTML file (`templates/run_view.html.jinja`): no external script, style or
font, and the resource's `_meta.ui.csp` asks for no domain, so hosts apply the spec's restrictive CSP.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import jinja2
import mcp_types as types
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID, client_supports_apps
from mcp.server.extension import Extension
from mcp.server.mcpserver import Context

from ipybox.approval.ask_events import AskView
from ipybox.approval.request import ApprovalRequest
from ipybox.mcp_server.kernels import caller_of, session_key
from ipybox.rules import AuditLog
from ipybox.rules.audit import code_hash

__all__ = [
    "ANSWER_TOOL",
    "APP_MIME_TYPE",
    "EXTENSION_ID",
    "RUN_META",
    "STATE_TOOL",
    "VIEW_URI",
    "AppViews",
    "AppsExtension",
    "Run",
    "supports_apps",
]

VIEW_URI: Final = "ui://ipybox/run.html"
STATE_TOOL: Final = "ipybox_view_run"
ANSWER_TOOL: Final = "ipybox_view_answer"
APP_TOOLS: Final = frozenset({STATE_TOOL, ANSWER_TOOL})
RUN_META: Final = "io.github.ipybox/run"
"""The key of a result's `_meta` that names its run (for the view; never in `content`)."""

RUNS_KEPT: Final = 16  # runs remembered per session, newest last
SESSIONS_KEPT: Final = 64  # sessions whose runs are remembered, the most recent ones
KEYS_KEPT: Final = 256  # view keys remembered in all (a host reads the resource per view, or once)
MAX_CALLS: Final = 200  # tool calls of a run shown at most
MAX_TEXT: Final = 20_000  # characters of a run's output shown at most

_TEMPLATES = Path(__file__).parent / "templates"
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
_USED_KEPT = 4096  # answered asks remembered, so that none is answered twice through a view

Owner = tuple[str, str | None]
"""Who a key or a run belongs to: the caller and its handshake-era session (`None` on 2026-07-28)."""


class AppsExtension(Extension):
    """Advertises `io.modelcontextprotocol/ui` in the server's capabilities; the resource and the tools
    are the server's own (`WorkspaceMCPServer`), since they depend on who reads and calls them."""

    identifier = EXTENSION_ID


def supports_apps(ctx: Context) -> bool:
    """Whether the client of `ctx`'s request declared the extension with the app MIME type."""
    try:
        return client_supports_apps(ctx)
    except Exception:  # no request context: no client to render a view
        return False


def owner_of(ctx: Context) -> Owner:
    return caller_of(ctx), session_key(ctx)


@dataclass(eq=False)
class _Ask:
    request: ApprovalRequest
    view: AskView
    answered_by_view: bool = False


@dataclass(eq=False)
class Run:
    """One `execute_ipython_cell` of an Apps client, as the view shows it."""

    id: str
    owner: Owner
    code: str
    started: datetime
    status: Literal["running", "done", "error"] = "running"
    text: str = ""
    images: list[str] = field(default_factory=list)
    asks: OrderedDict[str, _Ask] = field(default_factory=OrderedDict)
    _serial: int = 0

    def add_ask(self, request: ApprovalRequest, rule: dict[str, Any]) -> str:
        """Show `request` as a pending ask of this run; its id."""
        self._serial += 1
        ask_id = f"{self._serial}-{secrets.token_urlsafe(9)}"
        view = AskView(
            id=ask_id,
            server=request.server_name,
            tool=request.tool_name,
            args=dict(request.tool_args),
            annotations=dict(request.annotations),
            rule_id=rule.get("rule"),
            reason=rule.get("reason") or "",
            asked_of="elicitation",
            routes=["elicitation"],
            asked_at=datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            links=dict(request.links),
        )
        self.asks[ask_id] = _Ask(request, view)
        return ask_id

    def finish(self, content: list[types.TextContent | types.ImageContent] | None, error: str | None) -> None:
        self.status = "error" if error is not None else "done"
        texts = [item.text for item in content or [] if isinstance(item, types.TextContent)]
        self.text = (error if error is not None else "\n".join(texts))[:MAX_TEXT]
        self.images = [item.data for item in content or [] if isinstance(item, types.ImageContent)]


class AppViews:
    """The runs of Apps clients and the keys of their views; see the module docstring."""

    def __init__(self, audit: Path | None) -> None:
        self._audit = AuditLog(audit) if audit is not None else None
        self._keys: OrderedDict[str, tuple[str, Owner]] = OrderedDict()  # key id -> (secret, owner)
        self._runs: OrderedDict[Owner, deque[Run]] = OrderedDict()  # least recently run first
        self._used: set[str] = set()  # asks answered through a view (never answered twice)
        self._environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
        )

    # -- the resource

    def html(self, ctx: Context) -> str:
        """The view, with a key of its own for the session reading it."""
        key_id = secrets.token_urlsafe(9)
        secret = secrets.token_urlsafe(32)
        self._keys[key_id] = (secret, owner_of(ctx))
        while len(self._keys) > KEYS_KEPT:
            self._keys.popitem(last=False)
        template = self._environment.get_template("run_view.html.jinja")
        html = template.render(
            view_key=f"{key_id}.{secret}", state_tool=STATE_TOOL, answer_tool=ANSWER_TOOL, run_meta=RUN_META
        )
        # The CSP allows the one script by its hash (it reads its key from a meta tag, so the hash is
        # the same for every key): no inline script injected into the page could run.
        script = _SCRIPT.search(html)
        assert script is not None, "the view's template has its one script"
        digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
        return html.replace("__SCRIPT_HASH__", f"sha256-{digest}", 1)

    def _owner_of_key(self, ctx: Context, view_key: str) -> Owner:
        """The session `view_key` belongs to, which must be `ctx`'s.

        Raises:
            PermissionError: The key is not one this server minted for this session.
        """
        key_id, _, secret = view_key.partition(".")
        known = self._keys.get(key_id)
        # The secret is compared in constant time; an unknown id is compared against a dummy all the same.
        expected, owner = known if known is not None else ("x" * 43, ("", None))
        matches = secrets.compare_digest(expected.encode(), secret.encode())
        if known is None or not matches or owner != owner_of(ctx):
            raise PermissionError(
                f"{STATE_TOOL} and {ANSWER_TOOL} serve only the ipybox run view this session rendered "
                f"({VIEW_URI}); they are not for the model"
            )
        return owner

    # -- runs

    def start(self, ctx: Context, code: str) -> Run:
        owner = owner_of(ctx)
        run = Run(id="run-" + secrets.token_urlsafe(12), owner=owner, code=code, started=datetime.now(UTC))
        runs = self._runs.setdefault(owner, deque(maxlen=RUNS_KEPT))
        runs.append(run)
        self._runs.move_to_end(owner)
        while len(self._runs) > SESSIONS_KEPT:  # sessions that ended long ago (their images are held)
            self._runs.popitem(last=False)
        return run

    def _run(self, owner: Owner, run_id: str | None) -> Run | None:
        runs = self._runs.get(owner)
        if not runs:
            return None
        if run_id is None:
            return runs[-1]
        return next((run for run in runs if secrets.compare_digest(run.id, run_id)), None)

    async def state(self, ctx: Context, view_key: str, run_id: str | None) -> dict[str, Any]:
        """The run `run_id` (the session's newest without one) as the view shows it.

        Raises:
            PermissionError: Not the view's key (see `_owner_of_key`).
        """
        owner = self._owner_of_key(ctx, view_key)
        run = self._run(owner, run_id)
        if run is None:
            return {"run": None}
        calls = await asyncio.to_thread(self._calls, run)
        pending = [
            ask.view.model_dump(mode="json") for ask in run.asks.values() if ask.request.decision is None
        ]
        return {
            "run": {
                "id": run.id,
                "code": run.code,
                "status": run.status,
                "started": run.started.isoformat(timespec="seconds"),
                "calls": calls,
                "asks": pending,
                "output": run.text,
                "images": run.images,
                "elicitation_route": True,
            }
        }

    def _calls(self, run: Run) -> list[dict[str, Any]]:
        """The audit log's entries of the run's cell, since it started (the newest `MAX_CALLS`)."""
        if self._audit is None:
            return []
        wanted = {code_hash(run.code), code_hash(run.code.rstrip("\n"))}
        since = run.started.timestamp() - 1.0
        calls: deque[dict[str, Any]] = deque(maxlen=MAX_CALLS)
        try:
            entries = self._audit.iter_entries()
            for entry in entries:
                if entry.code not in wanted:
                    continue
                try:
                    moment = datetime.fromisoformat(entry.time.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    continue
                if moment < since:
                    continue
                calls.append(
                    {
                        "time": entry.time,
                        "server": entry.server,
                        "tool": entry.tool,
                        "args": entry.args,
                        "decision": entry.decision,
                        "rule_id": entry.rule_id,
                        "decided_by": entry.decided_by,
                        "reason": entry.reason,
                        "by": entry.by,
                    }
                )
        except OSError:
            return list(calls)
        return list(calls)

    async def answer(self, ctx: Context, view_key: str, run_id: str, ask_id: str, accept: bool) -> str:
        """Decide the pending ask `ask_id` of run `run_id` once; what was done, for the view.

        Raises:
            PermissionError: Not the view's key, or not a run of its session.
            ValueError: No such ask is pending (answered already, here or elsewhere, or never asked).
        """
        owner = self._owner_of_key(ctx, view_key)
        run = self._run(owner, run_id)
        if run is None:
            raise PermissionError("no such run in this session")
        ask = run.asks.get(ask_id)
        if ask is None:
            raise ValueError("no such question is pending")
        if ask_id in self._used or ask.request.decision is not None:
            by = ask.request.withdrawn_by
            settled = "through this view" if ask.answered_by_view else f"by {by or 'someone else'}"
            raise ValueError(f"this question was already answered {settled}")
        self._used.add(ask_id)
        if len(self._used) > _USED_KEPT:  # ids are unique per run: forgetting the oldest risks nothing
            self._used.pop()
        ask.answered_by_view = True
        await (ask.request.accept() if accept else ask.request.reject())
        return f"{'allowed' if accept else 'denied'} once: {ask.view.call_text}"
