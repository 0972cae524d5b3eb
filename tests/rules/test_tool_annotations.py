from __future__ import annotations

import pytest

from ipybox.rules import ANNOTATION_DEFAULTS
from ipybox.rules.tool_annotations import annotation_value, check_annotation_names


def test_defaults_are_the_mcp_spec_defaults() -> None:
    assert dict(ANNOTATION_DEFAULTS) == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    with pytest.raises(TypeError):
        ANNOTATION_DEFAULTS["readOnlyHint"] = True  # type: ignore[index]


def test_annotation_value() -> None:
    assert annotation_value({"readOnlyHint": True}, "readOnlyHint") is True
    assert annotation_value({}, "destructiveHint") is True
    assert annotation_value({"destructiveHint": None}, "destructiveHint") is True
    assert annotation_value({"destructiveHint": "false"}, "destructiveHint") is True  # not a bool: undeclared
    assert annotation_value({"destructiveHint": False}, "destructiveHint") is False


def test_check_annotation_names() -> None:
    check_annotation_names(["readOnlyHint", "openWorldHint"])
    with pytest.raises(
        ValueError, match=r"^unknown annotation 'title'; known annotations: destructiveHint, "
    ):
        check_annotation_names(["readOnlyHint", "title"])
