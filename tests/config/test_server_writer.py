"""`write_server` and `remove_server`: one `[servers.<name>]` written or removed, the rest of the file kept
byte for byte, nothing written unless the result loads as intended."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ipybox.config import ServerWriteError, load_config, remove_server, write_server
from ipybox.config.server_writer import render_server

FILE = """\
#:schema ./schema.json
# My workspace.

[sandbox]
enabled = false  # kernels

# A filesystem server for the data.
[servers.fs]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "."]
# sandbox = true  (commented-out option of fs)

[servers.fs.env]
LOG = "debug"

# The time server.
[servers.time]
command = "mcp-server-time"

# Tool-call approval: this comment introduces [approval], not a server.
[approval]
default = "ask"
"""

TIME = '[servers.time]\ncommand = "mcp-server-time"\n'


def config(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "ipybox.toml"
    path.write_bytes(text.encode())
    return path


def leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "ipybox.toml")


def test_a_new_server_goes_after_the_last_server_and_nothing_else_changes(tmp_path: Path) -> None:
    path = config(tmp_path)
    edit = write_server(path, "fetch", {"command": "uvx", "args": ["mcp-server-fetch"], "env": {"K": "${K}"}})
    block = '[servers.fetch]\ncommand = "uvx"\nargs = ["mcp-server-fetch"]\nenv = { K = "${K}" }\n'
    at = FILE.index("# Tool-call approval")
    assert path.read_text() == FILE[:at] + block + "\n" + FILE[at:]
    assert (edit.action, edit.text) == ("added", block)
    assert path.read_text().splitlines()[edit.line - 1] == "[servers.fetch]"
    assert load_config(path).servers["fetch"].env == {"K": "${K}"}
    assert leftovers(tmp_path) == []


def test_a_file_without_servers_gets_the_table_at_its_end(tmp_path: Path) -> None:
    path = config(tmp_path, "[sandbox]\nenabled = false  # no newline at the end")
    write_server(path, "time", {"command": "mcp-server-time"})
    assert path.read_text() == "[sandbox]\nenabled = false  # no newline at the end\n\n" + TIME


def test_crlf_line_endings_are_kept(tmp_path: Path) -> None:
    path = config(tmp_path, FILE.replace("\n", "\r\n"))
    write_server(path, "fetch", {"command": "uvx"})
    remove_server(path, "fs")
    data = path.read_bytes()
    assert data.count(b"\n") == data.count(b"\r\n")
    assert b'[servers.fetch]\r\ncommand = "uvx"\r\n' in data and b"fs" not in data


def test_replacing_writes_the_table_where_the_old_one_was_and_drops_its_sub_tables(tmp_path: Path) -> None:
    path = config(tmp_path)
    with pytest.raises(ServerWriteError, match="it has a server 'fs' already"):
        write_server(path, "fs", {"command": "other"})
    assert path.read_text() == FILE
    edit = write_server(path, "fs", {"command": "other", "sandbox": True}, replace=True)
    text = path.read_text()
    assert edit.action == "replaced"
    assert '# A filesystem server for the data.\n[servers.fs]\ncommand = "other"\nsandbox = true\n\n' in text
    assert "LOG" not in text and "commented-out option of fs" not in text
    assert text.endswith("# The time server.\n" + TIME + "\n" + FILE[FILE.index("# Tool-call") :])
    assert load_config(path).servers["fs"].env == {}


def test_removing_takes_the_table_its_sub_tables_and_the_comments_touching_them(tmp_path: Path) -> None:
    path = config(tmp_path)
    edit = remove_server(path, "fs")
    assert (edit.action, edit.line) == ("removed", 8)
    assert path.read_text() == (
        "#:schema ./schema.json\n# My workspace.\n\n[sandbox]\nenabled = false  # kernels\n\n"
        "# The time server.\n" + TIME + "\n" + FILE[FILE.index("# Tool-call") :]
    )


def test_removing_the_last_table_of_the_file_leaves_no_blank_lines_behind(tmp_path: Path) -> None:
    path = config(tmp_path, "[sandbox]\nenabled = false\n\n# The time server.\n" + TIME)
    remove_server(path, "time")
    assert path.read_text() == "[sandbox]\nenabled = false\n"


def test_comments_that_open_the_file_stay_with_it(tmp_path: Path) -> None:
    path = config(tmp_path, "#:schema ./schema.json\n# My workspace.\n" + TIME)
    remove_server(path, "time")
    assert path.read_text() == "#:schema ./schema.json\n# My workspace.\n"


def test_an_unknown_server_is_refused_naming_the_configured_ones(tmp_path: Path) -> None:
    path = config(tmp_path)
    with pytest.raises(ServerWriteError, match=r"it has no server 'nope' \(its servers are fs, time\)"):
        remove_server(path, "nope")
    assert path.read_text() == FILE


def test_a_write_that_would_not_load_leaves_the_file_byte_identical(tmp_path: Path) -> None:
    path = config(tmp_path, FILE.replace("\n", "\r\n"))
    before = path.read_bytes()
    bad = {"command": "x", "sandbox": {"network": {"allowAllUnixSockets": True}}}
    with pytest.raises(ServerWriteError, match=r"would not load with this change:\n.*ipybox.toml:\d+:\d+: "):
        write_server(path, "bad", bad)
    assert path.read_bytes() == before and leftovers(tmp_path) == []


def test_a_file_that_does_not_load_is_not_edited(tmp_path: Path) -> None:
    path = config(tmp_path, "[sandbox]\nenabeld = true\n")
    with pytest.raises(ServerWriteError, match="does not load as it is; fix it first"):
        write_server(path, "time", {"command": "t"})
    assert path.read_text() == "[sandbox]\nenabeld = true\n" and leftovers(tmp_path) == []


def test_a_server_the_environment_overrides_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config(tmp_path)
    monkeypatch.setenv("IPYBOX_SERVERS__NEW__COMMAND", "from-the-environment")
    with pytest.raises(ServerWriteError, match="would not take effect: the servers in effect come from"):
        write_server(path, "new", {"command": "from-the-file"})
    assert path.read_text() == FILE


def test_names_are_checked_before_anything_is_read(tmp_path: Path) -> None:
    path = config(tmp_path)
    with pytest.raises(ServerWriteError, match="not a valid Python package name"):
        write_server(path, "my-server", {"command": "x"})
    with pytest.raises(ServerWriteError, match="reserved"):
        write_server(path, "shell", {"command": "x"})


def test_a_server_written_inline_is_removed_and_replaced(tmp_path: Path) -> None:
    text = '# servers\n[servers]\nfs = { command = "npx" }  # inline\ntime = { command = "t" }\n'
    path = config(tmp_path, text)
    write_server(path, "fs", {"command": "other"}, replace=True)
    assert tomllib.loads(path.read_text())["servers"] == {
        "time": {"command": "t"},
        "fs": {"command": "other"},
    }
    remove_server(path, "time")
    assert tomllib.loads(path.read_text())["servers"] == {"fs": {"command": "other"}}
    assert path.read_text().startswith("# servers\n[servers]\n")


def test_servers_written_as_one_inline_table_are_refused_with_the_table_to_add_by_hand(
    tmp_path: Path,
) -> None:
    text = 'servers = { time = { command = "t" } }\n'
    path = config(tmp_path, text)
    with pytest.raises(ServerWriteError, match=r"add it by hand:\n\[servers\.fetch\]\ncommand = \"uvx\""):
        write_server(path, "fetch", {"command": "uvx"})
    assert path.read_text() == text and leftovers(tmp_path) == []


def test_headers_inside_multiline_strings_are_not_taken_for_tables(tmp_path: Path) -> None:
    rule = (
        '[[approval.rules]]\nserver = "x"\ndecision = "deny"\n'
        'match = [{ server = "x", tool = "t", args = { text = """\n[servers.time]\ncommand = "fake"\n""" } }]\n'
    )
    path = config(tmp_path, TIME + "\n" + rule)
    remove_server(path, "time")
    assert path.read_text() == rule
    write_server(path, "time", {"command": "real"})
    assert path.read_text() == rule + '\n[servers.time]\ncommand = "real"\n'


def test_a_symlink_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.toml"
    target.write_text(TIME)
    (tmp_path / "ipybox.toml").symlink_to(target)
    with pytest.raises(ServerWriteError, match="symlink"):
        remove_server(tmp_path / "ipybox.toml", "time")
    assert target.read_text() == TIME


def test_a_missing_file_points_at_ipybox_init(tmp_path: Path) -> None:
    with pytest.raises(ServerWriteError, match="ipybox init"):
        write_server(tmp_path / "ipybox.toml", "time", {"command": "t"})


def test_the_file_keeps_its_mode(tmp_path: Path) -> None:
    path = config(tmp_path)
    path.chmod(0o640)
    write_server(path, "fetch", {"command": "uvx"})
    assert os.stat(path).st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    "table",
    [
        {
            "command": "C:\\tools\\srv.exe",
            "args": ["a\nb", 'quote"', "${X}"],
            "env": {"A-B": "1", "x.y": "2"},
        },
        {"command": "x", "sandbox": {"network": {"allowedDomains": ["*.example.com"]}}, "call_timeout": 1.5},
        {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${T}"}, "type": "sse"},
        {"command": "x", "env": {}, "enabled": False},
    ],
)
def test_what_is_written_loads_back_as_the_same_table(tmp_path: Path, table: dict[str, Any]) -> None:
    path = config(tmp_path)
    edit = write_server(path, "srv", table)
    assert edit.text == render_server("srv", table)
    assert tomllib.loads(path.read_text())["servers"]["srv"] == table
