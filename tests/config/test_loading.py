"""Loading any file content as `ipybox.toml`: one `ConfigError` naming the place and what to do, never
another exception (a traceback in `validate`, `status` or `down`) and never a hang."""

from __future__ import annotations

import os
import tempfile
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ipybox.config import ConfigError, WorkspaceConfig, load_config
from ipybox.config.loading import MAX_CONFIG_CHARS, MAX_NESTING
from ipybox.config.positions import too_deep

WriteConfig = Callable[[str], Path]

DEEP = f"nesting deeper than {MAX_NESTING} levels"


@pytest.mark.parametrize(
    ("text", "place", "how"),
    [
        ("x = " + "[" * 100_000, (1, 5 + MAX_NESTING), "(arrays and inline tables)"),
        ("x = " + "{a = " * 100_000, (1, 5 + 5 * MAX_NESTING), "(arrays and inline tables)"),
        ("[servers.s]\ncommand = 'x'\nargs = [" + "[" * 1000 + "]" * 1001, (3, 8 + MAX_NESTING), "(arrays"),
        ("\n\n  x" + ".a" * 5000 + " = 1\n", (3, 3), "(a dotted key or table name)"),
        ("[x" + ".a" * 100_000 + "]\n", (1, 2), "(a dotted key or table name)"),
        ('[servers."a.b"' + '."c"' * 100 + "]\n", (1, 2), "(a dotted key or table name)"),
    ],
    ids=["arrays", "inline-tables", "args", "dotted-key", "table-name", "quoted-parts"],
)
def test_deep_nesting_is_one_config_error_with_its_place(
    write_config: WriteConfig, text: str, place: tuple[int, int], how: str
) -> None:
    path = write_config(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert len(caught.value.problems) == 1
    assert (caught.value.line, caught.value.column) == place
    assert str(caught.value).startswith(f"{path}:{place[0]}:{place[1]}: {DEEP} {how}")
    assert str(caught.value).endswith("an ipybox.toml needs a few")


def test_nesting_up_to_the_limit_is_read_as_toml(write_config: WriteConfig) -> None:
    # Brackets and dots in strings and comments are not nesting; the file then fails only for its key.
    strings = 'y = ["[[[[", "a.b.c", """\n[[[[\n""", \'{{{{\']  # [[[[ a.b.c.d\n'
    depth = MAX_NESTING - 1  # the array `x` is one level itself
    path = write_config(strings + "x = [" + "[" * depth + "]" * depth + "]\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "unknown key 'y' at the top level" in str(caught.value)
    assert DEEP not in str(caught.value)


def test_nesting_is_found_in_one_pass_without_recursion() -> None:
    assert too_deep("x = " + "[" * 1_000_000, MAX_NESTING) == (
        (1, 5 + MAX_NESTING),
        f"{DEEP} (arrays and inline tables)",
    )
    assert too_deep("a = 1.5\nb = [1.5, 2.5]\n[c.d]\ne.f = 'g.h'\n", 3) is None
    assert too_deep('"""' + "[" * 100, 3) is None  # an unterminated string is not nesting


def test_a_file_too_long_is_one_config_error(write_config: WriteConfig) -> None:
    path = write_config("# " + "x" * MAX_CONFIG_CHARS)
    with pytest.raises(ConfigError, match="longer than"):
        load_config(path)


def test_a_fifo_is_one_config_error_not_a_reader_waiting_forever(workspace: Path) -> None:
    os.mkfifo(workspace / "ipybox.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(workspace)


def test_a_directory_is_one_config_error(workspace: Path) -> None:
    (workspace / "ipybox.toml").mkdir()
    with pytest.raises(ConfigError, match=r"ipybox\.toml: is a directory"):
        load_config(workspace)


# -- fuzzing: whatever the file holds, loading gives a config or a ConfigError


def _load(content: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "ipybox.toml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path)
        except ConfigError as e:
            assert e.problems and all(problem.reason for problem in e.problems)


def _keys(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[str]:
    """Every key of the configuration's models, as written and as named."""
    for name, field in model.model_fields.items():
        yield name
        if field.alias:
            yield field.alias
        for kind in [field.annotation, *typing.get_args(field.annotation)]:
            for inner in [kind, *typing.get_args(kind)]:
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner not in seen:
                    seen.add(inner)
                    yield from _keys(inner, seen)


KEYS = sorted(set(_keys(WorkspaceConfig, set())))
_key = st.one_of(st.sampled_from(KEYS), st.text(max_size=6))
_scalar = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=10),
    st.sampled_from(["ask", "allow", "deny", "127.0.0.1", "${X}", "**", "(a+)+", "edge", "npx"]),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_key, inner, max_size=3)),
    max_leaves=12,
)
_document = st.dictionaries(_key, st.dictionaries(_key, _value, max_size=4), max_size=4)
# Text made of TOML's own pieces reaches further into the parser than arbitrary text.
_pieces = st.sampled_from(
    [
        "[",
        "]",
        "[[",
        "]]",
        "{",
        "}",
        "=",
        ",",
        ".",
        '"',
        "'",
        '"""',
        "'''",
        "#",
        "\n",
        " ",
        "\\",
        "1",
        "1.5",
        "true",
        "1979-05-27T07:32:00Z",
        "x",
        "servers",
        "approval",
        "rules",
        "command",
        *KEYS[:20],
    ]
)
_toml_like = st.lists(_pieces, max_size=60).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200), _toml_like))
def test_any_content_loads_or_is_a_config_error(content: str | bytes) -> None:
    _load(content)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=_document)
@pytest.mark.integration  # no process, but a property test that takes seconds
def test_any_toml_document_loads_or_is_a_config_error(document: dict[str, Any]) -> None:
    _load(tomlkit.dumps(document))
