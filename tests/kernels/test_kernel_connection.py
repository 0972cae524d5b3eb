"""`log_tail`: the end of the gateway's log that error messages quote."""

from __future__ import annotations

from pathlib import Path

from ipybox.kernels.kernel_connection import log_tail

GATEWAY_TRACEBACK = [
    "[E 00:00:01 KernelGatewayApp] Uncaught exception GET /api/kernels/k/channels",
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/tornado/web.py", line 1790, in _execute',
    "    result = await result",
    "             ^^^^^^^^^^^^",
    *[f'  File "/venv/handler{i}.py", line {i}, in open\n    self.kernel_ws_protocol' for i in range(6)],
    "AttributeError: 'NoneType' object has no attribute 'kernel_ws_protocol'",
]


def test_the_kernels_own_error_stays_in_the_tail_after_a_gateway_traceback(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text(
        "\n".join(["[I 00:00:00 KernelGatewayApp] starting", "kernel-boom: cannot start", *GATEWAY_TRACEBACK])
    )
    tail = log_tail(log, lines=5)
    assert "kernel-boom: cannot start" in tail
    assert "Traceback (most recent call last):" in tail
    assert tail.endswith("AttributeError: 'NoneType' object has no attribute 'kernel_ws_protocol'")
    assert "handler3.py" not in tail


def test_a_missing_log_has_no_tail(tmp_path: Path) -> None:
    assert log_tail(tmp_path / "absent.log") == ""
    assert log_tail(None) == ""


def test_nested_traceback_lines_of_the_gateway_never_push_the_kernels_error_out(tmp_path: Path) -> None:
    # As an exception group or a chained exception logs them: every line of the nested tracebacks indented.
    nested = [
        "[E 00:00:02 KernelGatewayApp] Exception in callback",
        "  + Exception Group Traceback (most recent call last):",
        '  |   File "/venv/tornado/web.py", line 1790, in _execute',
        "  |     result = await result",
        "  |              ^^^^^^^^^^^^",
        "    AttributeError: 'NoneType' object has no attribute 'kernel_ws_protocol'",
    ]
    lines = ["kernel-boom: cannot start", *nested, *nested, *GATEWAY_TRACEBACK]
    (tmp_path / "gateway.log").write_text("\n".join(lines))
    tail = log_tail(tmp_path / "gateway.log", lines=6)
    assert tail.splitlines()[1] == "kernel-boom: cannot start", tail
    assert "^^^" not in tail and "    AttributeError" not in tail
