"""`path_links`: an asked call's path arguments that lead elsewhere through a link, resolved on the host,
and how they reach the application (`CallParams` on the wire, `ApprovalRequest.links`)."""

from __future__ import annotations

import os
from pathlib import Path

from ipybox.approval.links import MAX_PATH_CHARS, PathLink, path_links
from ipybox.approval.wire import ApprovalAsk, CallParams, parse_ask
from ipybox.rules.calls import ToolCall


def _workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "ipybox.toml").write_text("")
    (workspace / "out").mkdir()
    os.symlink("../ipybox.toml", workspace / "sub" / "notes.md")
    os.symlink("../out", workspace / "sub" / "out-link")
    os.symlink(str(tmp_path), workspace / "sub" / "up")
    (workspace / "sub" / "plain.md").write_text("")
    return workspace


def test_a_path_through_a_link_shows_where_it_leads_and_flags_protected_and_outside(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    args = {
        "path": "sub/notes.md",
        "source": "sub/out-link/new.md",  # a link in the middle, the file not there yet
        "destination": f"{workspace}/sub/up/elsewhere.txt",
        "paths": ["sub/plain.md", "./sub/notes.md"],
        "content": "sub/notes.md is not a path here, but it looks like one",
        "mode": "text",
    }
    links = path_links(args, base=workspace, workspace=workspace)
    assert links == {
        "path": PathLink(target=str(workspace / "ipybox.toml"), flag="protected"),
        "source": PathLink(target=str(workspace / "out" / "new.md")),
        "destination": PathLink(target=str(tmp_path / "elsewhere.txt"), flag="outside the workspace"),
        "paths[1]": PathLink(target=str(workspace / "ipybox.toml"), flag="protected"),
    }
    assert links["path"].describe() == f"→ {workspace / 'ipybox.toml'} (protected)"


def test_paths_without_links_and_values_that_are_no_paths_are_left_out(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    args = {
        "path": "sub/plain.md",
        "other": "out/../sub/plain.md",
        "long": "sub/notes.md" + "/x" * MAX_PATH_CHARS,
    }
    assert path_links(args, base=workspace, workspace=workspace) == {}
    assert path_links({"path": "notes.md"}, base=workspace / "sub", workspace=workspace) == {
        "path": PathLink(target=str(workspace / "ipybox.toml"), flag="protected")
    }


def test_the_links_reach_the_application_on_the_wire() -> None:
    link = PathLink(target="/ws/ipybox.toml", flag="protected")
    call = ToolCall("filesystem", "write_file", {"path": "sub/notes.md", "content": ""}, {})
    ask = parse_ask(ApprovalAsk(id=1, params=CallParams.of(call, {"path": link})).to_json())
    assert ask.params.links == {"path": link}
    assert parse_ask(ApprovalAsk(id=2, params=CallParams.of(call)).to_json()).params.links == {}
