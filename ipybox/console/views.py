"""The console's routes: its pages, the fragments its script fetches, and the forms they post.

Every route here runs behind `ConsoleGuard` (Host, Origin, session); every POST reads its body through
`read_form`, which checks the CSRF token first. Pages work without JavaScript (forms post and redirect
back); the script (`static/console.js`) adds live updates and answers without a reload.

Routes:

- `GET /login?token=T`: spends a one-time token, sets the session cookie, then sends the browser on to `/`
  with a page that refreshes to it, not a 303: a strict same-site cookie is not sent on a redirect
  that continues a navigation begun on another site (the login link clicked in a chat's web page), but
  it is on a navigation the console's own page starts.
- `GET /`, `GET /fragments/overview`: what runs, each kernel's memory and CPU time included
  (`target.status_with_kernels()`).
- `GET /asks`, `GET /asks/{id}/card`, `POST /asks/{id}/answer`: pending asks and their answers.
- `GET /asks/{id}/always?accept=allow|deny[&arg.NAME=any|exact|glob&glob.NAME=PATTERN]`: the preview of
  the rule an `always` answer writes (`preview_answer_rule`), each argument's condition to narrow, and the
  form that saves it (`POST /asks/{id}/answer` with `scope=always` and a `choice.NAME` per argument: what
  the preview showed is what is written, or refused with the reason).
- `GET /events`: the event stream (`ipybox.console.events`).
- `GET /audit`: the audit log, newest first, filtered, a page at a time (read in a thread).
- `GET /rules`, `POST /rules/explain`: the rules in effect and "would this call be allowed?".
- `POST /rules/edit` (`rule`, `edit` = disable|enable|remove): a rule switched off or on, or one an
  `always` answer wrote removed (`ipybox.config.rule_edit`); a flash says what changed.
- `POST /rules/args` (`rule`, `args` = a TOML inline table, empty for any): the argument conditions of a
  rule an `always` answer wrote, rewritten; a flash says what changed, or why not.
"""

from __future__ import annotations

import asyncio
import tomllib
from dataclasses import dataclass
from glob import escape as glob_escape
from typing import Any, Final, get_args

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ipybox.approval.ask_events import AnswerResult, AskView, settled_text
from ipybox.approval.asks import AskAnswer
from ipybox.config.rule_edit import RuleEditError, rule_args_text, written_by_an_answer
from ipybox.config.rule_writer import RuleWriteError, WrittenRule, exact_refusal, preview_answer_rule
from ipybox.console.auth import ConsoleAuth
from ipybox.console.events import AskStreams
from ipybox.console.forms import AnswerForm, ExplainForm, RuleEditForm, choices_of, read_form, session_of
from ipybox.console.guard import ConsoleSite
from ipybox.console.rendering import rules_in_order
from ipybox.console.target import ConsoleTarget
from ipybox.display_text import printable
from ipybox.rules import DecidedBy
from ipybox.rules.audit import AuditFilter

__all__ = ["AUDIT_PAGE_SIZE", "ConsoleViews"]

AUDIT_PAGE_SIZE: Final = 50
_AUDIT_FIELDS: Final = ("server", "tool", "decision", "rule_id", "decided_by", "since", "until")


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


@dataclass
class ConsoleViews:
    """The route handlers of one console.

    Attributes:
        target: The workspace shown.
        auth: Its login tokens and sessions.
        site: Its address (the cookie's name).
        streams: Its event streams.
        env: The templates.
        user: Who answers from this console, for `AskAnswer.by`: `console (<user>)`.
    """

    target: ConsoleTarget
    auth: ConsoleAuth
    site: ConsoleSite
    streams: AskStreams
    env: jinja2.Environment
    user: str

    # -- rendering

    def render(self, request: Request, template: str, code: int = 200, /, **values: Any) -> HTMLResponse:
        session = request.scope.get("state", {}).get("console_session")
        html = self.env.get_template(template).render(
            csrf=session.csrf if session is not None else "",
            logged_in=session is not None,
            path=request.url.path,
            pending_count=len(self.target.board.pending),
            **values,
        )
        return HTMLResponse(html, code)

    def refuse(self, request: Request, status: int, title: str, message: str) -> Response:
        """A refusal: a short page (or `{"error": ...}` for a script), never data."""
        if _wants_json(request) or request.url.path == "/events":
            return JSONResponse({"error": message}, status)
        html = self.env.get_template("message.html").render(
            title=title, message=message, csrf="", logged_in=False, path="", pending_count=0
        )
        return HTMLResponse(html, status)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """Starlette's handler for `HTTPException` (404, 405, the forms' 403/413/415)."""
        assert isinstance(exc, HTTPException)
        titles = {403: "Refused", 404: "Not found", 405: "Not allowed", 413: "Too big", 415: "Not a form"}
        detail = exc.detail if exc.status_code != 404 else "There is nothing at this address."
        return self.refuse(request, exc.status_code, titles.get(exc.status_code, "Error"), str(detail))

    # -- login

    async def login(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        if not self.auth.spend_login_token(token):
            return self.refuse(
                request,
                401,
                "This login link does not work",
                "The link is unknown, was used already, or expired (links work once, for 15 minutes). "
                "Run `ipybox console DIR` for a new one.",
            )
        session_id, _ = self.auth.new_session()
        response = self.render(request, "login.html")
        response.set_cookie(
            self.site.cookie_name, session_id, path="/", httponly=True, samesite="strict", secure=False
        )
        response.headers["referrer-policy"] = "no-referrer"  # the token is in this page's URL
        return response

    # -- overview

    async def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", **await self._overview())

    async def overview_fragment(self, request: Request) -> Response:
        return self.render(request, "_overview.html", **await self._overview())

    async def _overview(self) -> dict[str, Any]:
        board = self.target.board
        return {
            "status": await self.target.status_with_kernels(),
            "people": {"console": board.people("console"), "terminal": board.people("terminal")},
            "ask_routes": self.target.policy.ask,
        }

    # -- asks

    async def asks(self, request: Request) -> Response:
        session = session_of(request)
        views = [AskView.of(ask) for ask in self.target.board.pending]
        return self.render(request, "asks.html", asks=views, messages=session.take_flash())

    async def ask_card(self, request: Request) -> Response:
        ask = self.target.board.get(request.path_params["ask_id"])
        if ask is None:
            return Response("", 404)
        return self.render(request, "_ask.html", ask=AskView.of(ask))

    async def answer(self, request: Request) -> Response:
        fields = await read_form(request)
        ask_id: str = request.path_params["ask_id"]
        try:
            form = AnswerForm.parse(fields)
        except ValueError as e:
            return self._answered(request, AnswerResult(id=ask_id, ok=False, error=str(e)), status=400)
        ask = self.target.board.get(ask_id)
        what = AskView.of(ask).call_text if ask is not None else "the call"
        answer = AskAnswer(
            form.accept, form.scope, route="console", by=f"console ({self.user})", choices=form.choices
        )
        why_not = await self.target.answer(ask_id, answer)
        if why_not is None:
            settled = self.target.board.settled_with(ask_id)
            result = AnswerResult(id=ask_id, ok=True, settled=settled, accept=answer.accept)
            message = f"{what}: {answer.describe()}."
            if answer.scope == "session":
                message = f"{settled_text(answer.accept, settled)} ({what}, by {answer.by})."
        else:
            result = AnswerResult(id=ask_id, ok=False, error=why_not)
            message = f"{what}: not answered: {why_not}"
        return self._answered(request, result, message=message)

    async def always(self, request: Request) -> Response:
        """The preview of the rule an `always` answer writes, to narrow and save (no JavaScript needed)."""
        ask = self.target.board.get(request.path_params["ask_id"])
        if ask is None:
            session_of(request).flash.append("That call is no longer waiting: it was answered, or went away.")
            return RedirectResponse("/asks", 303)
        accept = request.query_params.get("accept", "allow") != "deny"
        chosen = choices_of(dict(request.query_params))
        preview: WrittenRule | None = None
        error = None
        try:
            preview = await asyncio.to_thread(
                preview_answer_rule,
                self.target.config_path,
                ask.call,
                accept=accept,
                asked_by=ask.rule_id,
                by=f"console ({self.user})",
                redact=self.target.audit.redact,
                choices=chosen,
            )
        except RuleWriteError as e:
            error = str(e)
        choices = dict(preview.choices) if preview is not None else chosen
        redacted = self.target.audit.redact(ask.call.args)
        rows = [
            {
                "name": name,
                "value": redacted.get(name),
                "choice": choices.get(name, "any").partition(":")[0],
                "glob": choices.get(name, "").partition(":")[2]
                if choices.get(name, "").startswith("glob:")
                else _glob_suggestion(value),
                "exact_refusal": exact_refusal(name, value, redacted.get(name)),
                "is_string": isinstance(value, str),
            }
            for name, value in ask.call.args.items()
        ]
        view = AskView.of(ask)
        return self.render(
            request,
            "always.html",
            400 if error else 200,
            ask=view,
            accept="allow" if accept else "deny",
            preview=preview,
            error=error,
            rows=rows,
            choices=choices,
            any_arguments=preview is not None and not _rule_table(preview.text).get("args"),
        )

    def _answered(
        self, request: Request, result: AnswerResult, *, status: int = 200, message: str | None = None
    ) -> Response:
        if _wants_json(request):
            # The script shows `error` as text: escaped visibly, as the templates show everything.
            shown = result.model_copy(
                update={"error": printable(result.error) if result.error else result.error}
            )
            return JSONResponse(shown.model_dump(mode="json"), status)
        session_of(request).flash.append(message or result.error or "")
        return RedirectResponse("/asks", 303)

    async def events(self, request: Request) -> Response:
        return self.streams.response(request)

    # -- audit

    async def audit(self, request: Request) -> Response:
        query = request.query_params
        fields = {name: query.get(name, "").strip() for name in _AUDIT_FIELDS}
        values: dict[str, Any] = {
            "fields": fields,
            "decided_by_options": get_args(DecidedBy),
            "page": None,
            "error": None,
            "before": None,
            "path_of_log": str(self.target.audit.path),
        }
        try:
            where = AuditFilter.parse(**fields)
            before_text = query.get("before", "").strip()
            if before_text and not before_text.isdigit():
                raise ValueError(f"before: expected a position in the log (a number), got {before_text!r}")
            before = int(before_text) if before_text else None
        except ValueError as e:
            values["error"] = str(e)
            return self.render(request, "audit.html", 400, **values)
        try:
            page = await asyncio.to_thread(
                self.target.audit.page, before=before, limit=AUDIT_PAGE_SIZE, where=where
            )
        except OSError as e:
            values["error"] = f"The audit log could not be read: {e}"
            return self.render(request, "audit.html", 500, **values)
        values.update(page=page, before=before, filtered=any(fields.values()))
        return self.render(request, "audit.html", **values)

    # -- rules

    async def rules(self, request: Request) -> Response:
        values = self._rules(ExplainForm.blank())
        values["flash"] = session_of(request).take_flash()
        return self.render(request, "rules.html", **values)

    async def explain(self, request: Request) -> Response:
        form = ExplainForm.of(await read_form(request))
        values = self._rules(form)
        try:
            values["results"] = self.target.explain(form.call())
        except ValueError as e:  # a field of the form, or a shell line that cannot be read
            values["error"] = str(e)
            return self.render(request, "rules.html", 400, **values)
        return self.render(request, "rules.html", **values)

    async def accept_pins(self, request: Request) -> Response:
        """Pin what a server serves now in `ipybox.lock` (the Rules page's Accept button)."""
        fields = await read_form(request)
        server = fields.get("server", "").strip() or None
        try:
            accepted = await self.target.accept_pins(server)
            message = f"Pinned in ipybox.lock: {', '.join(accepted)}." if accepted else "Nothing to accept."
        except (KeyError, OSError) as e:
            message = f"Not accepted: {e.args[0] if isinstance(e, KeyError) else e}"
        values = self._rules(ExplainForm.blank())
        values["message"] = message
        return self.render(request, "rules.html", **values)

    async def rule_args(self, request: Request) -> Response:
        """Rewrite the argument conditions of a rule an always answer wrote (the Rules page's field)."""
        fields = await read_form(request)
        rule = fields.get("rule", "").strip()
        try:
            if not rule:
                raise ValueError("rule: give the id of the rule to change")
            message = (await self.target.set_rule_args(rule, fields.get("args", ""))).describe()
        except (ValueError, RuleEditError) as e:
            message = f"Nothing changed: {e}"
        session_of(request).flash.append(message)
        return RedirectResponse("/rules", 303)

    async def edit_rule(self, request: Request) -> Response:
        """Disable, enable or remove a rule (the Rules page's buttons); back to the page with what changed."""
        fields = await read_form(request)
        try:
            form = RuleEditForm.parse(fields)
            done = await self.target.edit_rule(form.rule, form.edit)
            message = done.describe()
        except (ValueError, RuleEditError) as e:
            message = f"Nothing changed: {e}"
        session_of(request).flash.append(message)
        return RedirectResponse("/rules", 303)

    def _rules(self, form: ExplainForm) -> dict[str, Any]:
        policy = self.target.policy
        status = self.target.status()
        try:
            text = self.target.config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        return {
            "flash": [],
            "by_answer": {
                row.id: rule_args_text(text, row.id)
                for row in rules_in_order(policy)
                if written_by_an_answer(text, row.id)
            },
            "policy_status": status.policy,
            "lint": status.reconciler.lint,
            "message": None,
            "policy": policy,
            "rows": rules_in_order(policy),
            "config_path": str(self.target.config_path),
            "form": form,
            "results": None,
            "error": None,
        }


def _rule_table(text: str) -> dict[str, Any]:
    """The `[[approval.rules]]` table of a rule's text as `answer_rule_text` writes it."""
    table: dict[str, Any] = tomllib.loads(text)["approval"]["rules"][0]
    return table


def _glob_suggestion(value: Any) -> str:
    """The glob the preview offers for a string: its directory's (`out/*` for `out/a.md`), else itself."""
    if not isinstance(value, str):
        return ""
    head, slash, _ = value.rpartition("/")
    return f"{glob_escape(head)}/*" if slash else glob_escape(value)
