"""The call channel's protocol is defined once (`ipybox.in_kernel.call_protocol`) and both ends use that
definition: the kernel's `ToolRunner` and the host's `CallChannel`/`ToolServer` (no processes: unit tests)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ipybox.in_kernel import call_protocol, tool_runner
from ipybox.in_kernel.call_protocol import CLOSING, ErrorKind, error, error_kind
from ipybox.rules import shell_commands
from ipybox.tool_server import call_channel

ROOT = Path(__file__).resolve().parents[2] / "ipybox"


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_error_kind_reads_back_from_its_answer_line(kind: ErrorKind) -> None:
    line = json.dumps(error(kind, "why"))
    assert json.loads(line) == {"error": {"type": kind.value, "message": "why"}}
    assert error_kind(json.loads(line)) is kind


@pytest.mark.parametrize(
    "answer", [{"result": 1}, {"error": {"type": "from_a_newer_server"}}, {"error": "x"}]
)
def test_an_answer_that_is_no_known_error_has_no_kind(answer: dict[str, object]) -> None:
    assert error_kind(answer) is None


def test_the_kernel_closes_its_connection_after_exactly_the_errors_the_channel_closes_after() -> None:
    assert {
        ErrorKind.UNAUTHORIZED,
        ErrorKind.IDLE_TIMEOUT,
        ErrorKind.TOO_MANY_CONNECTIONS,
        ErrorKind.REQUEST_TOO_LARGE,
    } == CLOSING


def test_the_shell_question_names_are_one_definition_on_both_ends() -> None:
    assert tool_runner.SHELL_KINDS is call_protocol.SHELL_KINDS
    assert call_channel.SHELL_KINDS is call_protocol.SHELL_KINDS
    assert shell_commands.KERNEL_SHELL_TOOLS is call_protocol.SHELL_KINDS
    assert call_channel.SHELL_SERVER == shell_commands.KERNEL_SHELL_SERVER == call_protocol.SHELL_SERVER
    assert (tool_runner.SERVER_ENV, tool_runner.TOKEN_ENV) == (
        call_protocol.SERVER_ENV,
        call_protocol.TOKEN_ENV,
    )


@pytest.mark.parametrize(
    "module", ["tool_server/call_channel.py", "tool_server/tool_server.py", "in_kernel/tool_runner.py"]
)
def test_no_end_spells_an_error_kind_or_an_op_as_a_string_literal(module: str) -> None:
    kinds = {kind.value for kind in ErrorKind}
    ops = {
        call_protocol.OP_RUN,
        call_protocol.OP_RESET,
        call_protocol.OP_SHELL,
        call_protocol.OP_SOURCE,
        call_protocol.OP_GENERATION,
    }
    tree = ast.parse((ROOT / module).read_text())
    literal_errors = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "error"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    # Docstrings describe the protocol in its wire spelling; code uses the protocol's names.
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    # An answer's keys (`{"reset": true}`) are not ops.
    keys = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Dict) for key in node.keys if key}
    literals = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in kinds | ops and id(node) not in docstrings | keys
    ]
    assert (literal_errors, literals) == ([], [])
