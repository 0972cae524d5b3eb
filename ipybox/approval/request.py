"""`ApprovalRequest`: one tool call waiting for a decision, as the application gets it.

It is the call (a [ToolCall][ipybox.rules.calls.ToolCall], the one model of a call) plus the means to
decide it once: `accept()` or `reject()`. A second, different decision is an error; a repeated one is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ipybox.approval.links import PathLink
from ipybox.rules.calls import Origin, ToolCall, is_untrusted, origin_text, provenance_json


class ApprovalRequest:
    """An MCP tool call waiting for the application to `accept()` or `reject()` it.

    Attributes:
        server_name: Name of the MCP server providing the tool.
        tool_name: Name of the tool.
        tool_args: The arguments the code passed.
        annotations: The tool's MCP annotations (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
            `openWorldHint`, `title`), as far as the server declares them.
        call: The same as a [ToolCall][ipybox.rules.calls.ToolCall] (its `caller` is not shown to
            applications: always "").
        links: Path arguments that lead elsewhere through a symlink, by argument name (`paths[1]` for an
            item of a list): where each leads, resolved by the host, and whether that is a protected name
            or outside the workspace ([PathLink][ipybox.approval.links.PathLink]). Show them with the
            arguments: `tool_args` say what the code wrote, `links` where a write would land.
        provenance: Where argument values came from, by argument path: the earlier results of the same
            session each matched (JSON: `server`, `tool`, `serial`, `label`, `time` per origin; see
            `ipybox.rules.provenance`). Show them with the arguments, highlighted when `untrusted`. Empty
            when no value matched (or the application's ipybox sends none).

    Example:
        ```python
        async for item in executor.stream(code):
            if isinstance(item, ApprovalRequest):
                if item.annotations.get("readOnlyHint"):
                    await item.accept()
                else:
                    await item.reject()
        ```
    """

    def __init__(
        self,
        server_name: str,
        tool_name: str,
        tool_args: dict[str, Any],
        respond: Callable[[bool], Awaitable[None]],
        annotations: dict[str, Any] | None = None,
        links: Mapping[str, PathLink] | None = None,
        provenance: Mapping[str, tuple[Origin, ...]] | None = None,
    ) -> None:
        self.links: dict[str, PathLink] = dict(links or {})
        self._tool_args = tool_args
        self._annotations = dict(annotations or {})
        self.call = ToolCall(
            server_name, tool_name, self._tool_args, self._annotations, provenance=dict(provenance or {})
        )
        self.provenance: dict[str, list[dict[str, Any]]] = provenance_json(self.call.provenance)
        self._respond = respond
        self._decided: bool | None = None
        self._withdrawn_by: str | None = None
        self._done_callbacks: list[Callable[[bool], None]] = []

    @classmethod
    def of(
        cls,
        call: ToolCall,
        respond: Callable[[bool], Awaitable[None]],
        links: Mapping[str, PathLink] | None = None,
    ) -> ApprovalRequest:
        """The request for `call`; `respond(accepted)` delivers the decision."""
        return cls(
            call.server, call.tool, dict(call.args), respond, dict(call.annotations), links, call.provenance
        )

    @property
    def server_name(self) -> str:
        return self.call.server

    @property
    def tool_name(self) -> str:
        return self.call.tool

    @property
    def tool_args(self) -> dict[str, Any]:
        return self._tool_args

    @property
    def annotations(self) -> dict[str, Any]:
        return self._annotations

    @property
    def decision(self) -> bool | None:
        """`True` once accepted, `False` once rejected, `None` while undecided."""
        return self._decided

    @property
    def withdrawn_by(self) -> str | None:
        """Who settled the call instead, when it was taken back (`withdraw`); "" when nobody answered in
        time; `None` while it is this request's to decide."""
        return self._withdrawn_by

    def withdraw(self, accepted: bool | None, by: str = "") -> None:
        """The call was settled elsewhere first (a person answered at the console or in `ipybox approve`),
        or its time ran out (`accepted` is `None`). The request counts as decided (`decision`), and a later
        `accept()` or `reject()` does nothing: the one who settled it has acted on it."""
        if self._decided is not None:
            return
        self._decided = bool(accepted)
        self._withdrawn_by = by
        for callback in self._done_callbacks:
            callback(self._decided)

    def add_done_callback(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(accepted)` once the request is decided."""
        self._done_callbacks.append(callback)

    async def accept(self) -> None:
        """Let the tool call run."""
        await self._decide(True)

    async def reject(self) -> None:
        """Refuse the tool call: the code calling it gets an `ApprovalRejectedError`."""
        await self._decide(False)

    async def _decide(self, accepted: bool) -> None:
        if self._withdrawn_by is not None:
            return  # settled elsewhere first (see `withdraw`)
        if self._decided is not None:
            if self._decided != accepted:
                raise RuntimeError(
                    f"this tool call was already {'accepted' if self._decided else 'rejected'}"
                )
            return
        self._decided = accepted
        try:
            await self._respond(accepted)
        finally:
            for callback in self._done_callbacks:
                callback(accepted)

    def __str__(self) -> str:
        args = ", ".join(
            f"{key}={value!r}" + (f" {self.links[key].describe()}" if key in self.links else "")
            for key, value in self.tool_args.items()
        )
        return f"{self.server_name}.{self.tool_name}({args})"

    def origin_lines(self) -> list[str]:
        """One line per argument with an origin, as a person reads it (the MCP elicitation shows them):
        ``UNTRUSTED: `to` = a value from web.fetch result 3, untrusted``."""
        return [
            ("UNTRUSTED: " if is_untrusted(found) else "origin: ") + origin_text(path, found)
            for path, found in self.provenance.items()
        ]

    def __repr__(self) -> str:
        return f"ApprovalRequest({self})"
