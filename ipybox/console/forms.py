"""The console's forms, read and checked: the CSRF token first, then each field, with one message naming the
field that is wrong and what it takes.

Contracts:

- `read_form` is the only way a route reads a POST body, and it checks the session's CSRF token (the
  `X-CSRF-Token` header a script sends, or the `csrf` field a form sends) before anything else: a POST
  without the right token is refused with 403 and its fields are never looked at.
- Bodies are `application/x-www-form-urlencoded` (what the pages' forms and script send), at most
  `MAX_FORM_BYTES`, read without the multipart parser.
- A field that is wrong raises `ValueError` with a message for the person, naming the field; routes show
  it on the page, never a 500.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, get_args
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request

from ipybox.approval.asks import Scope
from ipybox.config.rule_edit import RuleEdit
from ipybox.console.auth import Session
from ipybox.rules import ToolCall
from ipybox.rules.tool_annotations import check_annotation_names

__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "MAX_FORM_BYTES",
    "AnswerForm",
    "ExplainForm",
    "RuleEditForm",
    "choices_of",
    "read_form",
    "session_of",
]

CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-csrf-token"
MAX_FORM_BYTES: Final = 256 * 1024
"""Enough for a call's arguments pasted into the rules form; a bigger body is refused (413) unread."""
_MAX_FIELDS: Final = 160  # an always answer's form carries a choice per argument
_SCOPES: Final[dict[str, Scope]] = {scope: scope for scope in get_args(Scope)}
_EDITS: Final[dict[str, RuleEdit]] = {edit: edit for edit in get_args(RuleEdit)}


def session_of(request: Request) -> Session:
    """The request's session (put there by `ConsoleGuard`)."""
    session = request.scope.get("state", {}).get("console_session")
    if not isinstance(session, Session):  # a route outside the guard: a wiring bug, never served
        raise HTTPException(401, "not logged in")
    return session


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a POST, after its CSRF token was checked.

    Raises:
        HTTPException: 403 (missing or wrong CSRF token), 413 (body too big), 415 (not a form).
    """
    session = session_of(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):
        raise HTTPException(415, "The console's forms are sent as application/x-www-form-urlencoded.")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise HTTPException(413, f"A form of the console holds at most {MAX_FORM_BYTES // 1024} KiB.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, f"A form of the console holds at most {MAX_FORM_BYTES // 1024} KiB.")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=_MAX_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        pairs = None
    fields = dict(pairs or ())
    supplied = request.headers.get(CSRF_HEADER) or fields.pop(CSRF_FIELD, None)
    fields.pop(CSRF_FIELD, None)
    if not session.csrf_matches(supplied):
        raise HTTPException(
            403,
            "This form's security token is missing or out of date. Reload the page and try again.",
        )
    if pairs is None:
        raise HTTPException(400, "The form could not be read (not UTF-8, or too many fields).")
    return fields


CHOICE_PREFIX: Final = "choice."
"""The fields of an `always` answer that say what its rule requires of an argument: `choice.<name>` =
`any`, `exact` or `glob:PATTERN` (as the preview page showed them)."""


def choices_of(fields: dict[str, str]) -> dict[str, str]:
    """What the person chose for each argument, from the preview page's fields: `choice.<name>` (the
    encoded choice), or `arg.<name>` = any|exact|glob with the pattern in `glob.<name>` (the form that
    narrows the preview). Checked against the call by the rule writer."""
    choices = {
        key.removeprefix(CHOICE_PREFIX): value
        for key, value in fields.items()
        if key.startswith(CHOICE_PREFIX)
    }
    for key, kind in fields.items():
        if key.startswith("arg."):
            name = key.removeprefix("arg.")
            choices[name] = f"glob:{fields.get('glob.' + name, '')}" if kind == "glob" else kind
    return choices


@dataclass(frozen=True, slots=True)
class RuleEditForm:
    """`POST /rules/edit`: `rule` = a rule's id, `edit` = disable|enable|remove."""

    rule: str
    edit: RuleEdit

    @classmethod
    def parse(cls, fields: dict[str, str]) -> RuleEditForm:
        """The edit the fields ask for.

        Raises:
            ValueError: `rule` is missing or `edit` is not one of its values (the message names it).
        """
        rule = fields.get("rule", "").strip()
        if not rule:
            raise ValueError("rule: give the id of the rule to change")
        edit = _EDITS.get(fields.get("edit", ""))
        if edit is None:
            raise ValueError(f"edit: expected disable, enable or remove, got {fields.get('edit', '')!r}")
        return cls(rule, edit)


@dataclass(frozen=True, slots=True)
class AnswerForm:
    """`POST /asks/{id}/answer`: `accept` = allow|deny, `scope` = once|session|always; for `always`, the
    rule's argument conditions as the preview page chose them (`choices_of`; none: the writer's default)."""

    accept: bool
    scope: Scope
    choices: dict[str, str] | None = None

    @classmethod
    def parse(cls, fields: dict[str, str]) -> AnswerForm:
        """The answer the fields give.

        Raises:
            ValueError: `accept` or `scope` is not one of its values (the message names it).
        """
        accept = fields.get("accept", "")
        if accept not in ("allow", "deny"):
            raise ValueError(f"accept: expected allow or deny, got {accept!r}")
        scope = _SCOPES.get(fields.get("scope", "once"))
        if scope is None:
            raise ValueError(f"scope: expected once, session or always, got {fields.get('scope')!r}")
        choices = choices_of(fields) if scope == "always" else {}
        return cls(accept == "allow", scope, choices or None)


@dataclass(frozen=True, slots=True)
class ExplainForm:
    """`POST /rules/explain`: "would this call be allowed?".

    Attributes:
        server, tool: The names (for a shell line: server `shell`, any tool).
        args, annotations: The JSON objects as typed (shown back in the form).
    """

    server: str
    tool: str
    args: str
    annotations: str

    @classmethod
    def blank(cls) -> ExplainForm:
        return cls("", "", "{}", "{}")

    @classmethod
    def of(cls, fields: dict[str, str]) -> ExplainForm:
        return cls(
            fields.get("server", "").strip(),
            fields.get("tool", "").strip(),
            fields.get("args", "").strip() or "{}",
            fields.get("annotations", "").strip() or "{}",
        )

    def call(self) -> ToolCall:
        """The call to explain.

        Raises:
            ValueError: A field is missing or not what it takes (the message names it).
        """
        if not self.server:
            raise ValueError('server: give the server\'s name (for a shell line: "shell")')
        if not self.tool and self.server != "shell":
            raise ValueError("tool: give the tool's name")
        args = _json_object(
            "args", self.args, 'e.g. {"path": "notes.md"} (for a shell line: {"cmd": "ls -l"})'
        )
        annotations = _json_object("annotations", self.annotations, 'e.g. {"readOnlyHint": true}')
        try:
            check_annotation_names(annotations)
        except ValueError as e:
            raise ValueError(f"annotations: {e}") from None
        bad = sorted(name for name, value in annotations.items() if not isinstance(value, bool))
        if bad:
            raise ValueError(f"annotations: {', '.join(bad)} must be true or false")
        return ToolCall(self.server, self.tool, args, annotations)


def _json_object(name: str, text: str, example: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{name}: not valid JSON ({e}); write a JSON object, {example}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: a JSON object is needed, not {type(value).__name__}; {example}")
    return value
