"""`SessionGrants`: answers for a session cover the same tool in that session only, until it ends."""

from ipybox.approval.grants import SessionGrants
from ipybox.rules import ToolCall


def test_a_grant_covers_the_same_tool_with_any_arguments_in_its_session_only() -> None:
    grants = SessionGrants()
    grants.grant("L1", ToolCall("fs", "write_file", {"path": "a"}), True, "console (root)")
    found = grants.lookup("L1", ToolCall("fs", "write_file", {"path": "b"}))
    assert found is not None and found.accept and found.by == "console (root)"
    assert grants.lookup("L2", ToolCall("fs", "write_file")) is None
    assert grants.lookup(None, ToolCall("fs", "write_file")) is None
    assert grants.lookup("L1", ToolCall("fs", "write_bytes")) is None


def test_a_later_answer_replaces_the_earlier_one_and_forgetting_the_session_drops_them() -> None:
    grants = SessionGrants()
    grants.grant("L1", ToolCall("shell", "pip"), True, "a")
    grants.grant("L1", ToolCall("shell", "pip"), False, "b")
    found = grants.lookup("L1", ToolCall("shell", "pip"))
    assert found is not None and not found.accept
    grants.forget("L1")
    assert grants.of("L1") == {}
