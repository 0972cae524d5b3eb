"""Finding where keys are written in TOML source."""

from __future__ import annotations

import textwrap

from ipybox.config.positions import key_positions, table_headers

SOURCE = textwrap.dedent(
    '''\
    # comment with [brackets] and key = "value"
    top = 1
    [servers.fs]
    command = "npx"  # trailing [comment]
    args = ["a", { b = 1 }, [1, 2]]
    sandbox = { filesystem = { denyRead = ["~/.x"] } }
    [servers."my server"]
    url = """
    [not.a.table]
    x = 1
    """
    'literal key' = 'it''s'
    [[approval.rules]]
    id = "first"
    match = [
      { server = "a", tool = "b" },
      { server = "c", args = { path = "p" } },
    ]
    [[approval.rules]]
    a.b = 1
    [approval.rules.nested]
    c = 2
    '''
)


def test_key_positions() -> None:
    positions = key_positions(SOURCE)
    assert positions[("top",)] == (2, 1)
    assert positions[("servers",)] == (3, 2)
    assert positions[("servers", "fs")] == (3, 10)
    assert positions[("servers", "fs", "command")] == (4, 1)
    assert positions[("servers", "fs", "args", 1)] == (5, 14)
    assert positions[("servers", "fs", "args", 1, "b")] == (5, 16)
    assert positions[("servers", "fs", "args", 2, 1)] == (5, 29)
    assert positions[("servers", "fs", "sandbox", "filesystem", "denyRead")] == (6, 28)
    assert positions[("servers", "my server")] == (7, 10)
    assert positions[("servers", "my server", "url")] == (8, 1)
    assert positions[("servers", "my server", "literal key")] == (12, 1)
    assert positions[("approval", "rules", 0)] == (13, 1)
    assert positions[("approval", "rules", 0, "match", 1, "args", "path")] == (17, 28)
    assert positions[("approval", "rules", 1)] == (19, 1)
    assert positions[("approval", "rules", 1, "a", "b")] == (20, 3)
    # A sub-table of an array of tables belongs to its last element.
    assert positions[("approval", "rules", 1, "nested", "c")] == (22, 1)
    # Nothing inside strings or comments is taken for a key.
    assert not any("not" in path or "brackets" in path or "x" in path for path in positions)


def test_table_headers_are_listed_in_order_and_never_found_inside_strings() -> None:
    assert table_headers(SOURCE) == [
        (3, ("servers", "fs")),
        (7, ("servers", "my server")),
        (13, ("approval", "rules", 0)),
        (19, ("approval", "rules", 1)),
        (21, ("approval", "rules", 1, "nested")),
    ]


def test_scanning_never_fails_on_broken_input() -> None:
    for source in ["[", "a = ", 'a = "unterminated', "[[x]]\n[x", "a = [1, {b = ", "= 1", "'''", "a.b. = 1"]:
        key_positions(source)  # finds less, but raises nothing and terminates
    assert key_positions("[a]\nb = [") == {("a",): (1, 2), ("a", "b"): (2, 1)}
