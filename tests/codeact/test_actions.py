"""`ipybox.codeact.actions`: what is refused before any kernel runs (names, syntax, layout, existing actions,
shadowed modules, symlinks), the generated indexes, reading manifests as untrusted files, and (with a real
kernel) describing stale actions."""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.codeact import layout
from ipybox.codeact.actions import (
    MAX_SOURCE_BYTES,
    CodeActionError,
    _render_category_init,
    describe_actions,
    read_actions,
    save_code_action,
)
from ipybox.mcp_apigen.package import SymlinkRefusedError

API = textwrap.dedent('''
    from pydantic import BaseModel


    class Params(BaseModel):
        name: str


    class Result(BaseModel):
        greeting: str


    def run(params: Params) -> Result:
        """Greet someone."""
        from .impl import greet

        return Result(greeting=greet(params.name))
''')
IMPL = "def greet(name: str) -> str:\n    return 'hello ' + name\n"


async def no_kernel(code: str) -> str:
    raise AssertionError("code that should have been refused without a kernel was sent to one")


async def _refused(
    workspace: Path, category: object = "demo", name: object = "greet", **kwargs: object
) -> str:
    arguments: dict[str, object] = {"api": API, "impl": IMPL, "root": workspace, **kwargs}
    with pytest.raises(CodeActionError) as caught:
        await save_code_action(no_kernel, workspace / "mcptools", category, name, **arguments)  # type: ignore[arg-type]
    return str(caught.value)


@pytest.mark.parametrize(
    ("category", "name", "reason"),
    [
        ("..", "x", "must be a lowercase Python identifier"),
        ("../x", "greet", "must be a lowercase Python identifier"),
        ("a/b", "greet", "must be a lowercase Python identifier"),
        ("demo", "a/b", "must be a lowercase Python identifier"),
        ("demo", "__init__", "must be a lowercase Python identifier"),
        ("demo", ".hidden", "must be a lowercase Python identifier"),
        ("demo", "Api", "must be a lowercase Python identifier"),
        ("démo", "greet", "must be a lowercase Python identifier"),
        ("demo", "grüße", "must be a lowercase Python identifier"),
        ("demo", "", "must be a lowercase Python identifier"),
        ("demo", "x" * 49, "must be a lowercase Python identifier"),
        ("demo", "a__b", "must not contain '__'"),
        ("list", "greet", "would shadow the Python builtin 'list'"),
        ("demo", "class", "is a Python keyword"),
        ("demo", "api", "reserved for an action's own modules"),
        ("demo", "impl", "reserved for an action's own modules"),
        ("demo", None, "must be a lowercase Python identifier"),
    ],
)
async def test_names_that_could_become_paths_or_shadow_modules_are_refused_before_the_disk_is_touched(
    tmp_path: Path, category: object, name: object, reason: str
) -> None:
    message = await _refused(tmp_path, category, name)
    assert reason in message and "code action not saved" in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        ("from pydantic import BaseModel\n", "gentools/demo/greet/api.py: defines no run()"),
        ("def run() -> str:\n    return 'x'\n", "gentools/demo/greet/api.py:1:1: run() needs a docstring"),
        (
            "x = 1\n\nasync def run(query: str) -> str:\n    '''Search.'''\n",
            "gentools/demo/greet/api.py:3:1: run() takes arguments (query), so api.py must define them as a "
            "pydantic model `class Params(BaseModel)`",
        ),
        (
            "from pydantic import BaseModel\nclass Params(BaseModel):\n    q: str\n\ndef run() -> str:\n    '''Doc.'''\n",
            "gentools/demo/greet/api.py:5:1: run() must take one argument, params: Params",
        ),
        (
            "from .impl import run\n",
            "gentools/demo/greet/api.py:1:1: run must be a function defined in api.py",
        ),
        (
            "def run() -> str:\n    '''Doc.'''\n    return (\n",
            "gentools/demo/greet/api.py:3:12: SyntaxError: '(' was never closed",
        ),
        ("def run(:\n", "gentools/demo/greet/api.py:1:9: SyntaxError: invalid syntax"),
        (
            "x = 1\x00\n",
            "gentools/demo/greet/api.py: SyntaxError: source code string cannot contain null bytes",
        ),
        (
            "x = '\ud800'\n",
            "gentools/demo/greet/api.py: is not valid text (surrogates not allowed at character 5)",
        ),
        (b"def run(): pass", "gentools/demo/greet/api.py: must be Python source text, not bytes"),
    ],
)
async def test_an_api_that_does_not_match_the_layout_is_refused_with_its_line_and_column(
    tmp_path: Path, api: object, expected: str
) -> None:
    message = await _refused(tmp_path, api=api)
    assert expected in message
    assert message.startswith("code action demo.greet was not saved (nothing was written):\n")
    assert not (tmp_path / "gentools").exists()


async def test_every_problem_of_both_files_is_listed_at_once(tmp_path: Path) -> None:
    message = await _refused(tmp_path, api="def run():\n    pass\n", impl="def f(:\n")
    lines = message.splitlines()
    assert lines[1:3] == [
        "  gentools/demo/greet/api.py:1:1: run() needs a docstring: it is what agents read (and the MCP tool's "
        "description)",
        "  gentools/demo/greet/impl.py:1:7: SyntaxError: invalid syntax",
    ]
    assert lines[-1] == "Fix the code and save it again."


async def test_an_empty_or_oversized_impl_is_refused(tmp_path: Path) -> None:
    assert "gentools/demo/greet/impl.py: is empty" in await _refused(tmp_path, impl="# nothing\n")
    big = "x = 1\n" * (MAX_SOURCE_BYTES // 6 + 1)
    assert f"more than the {MAX_SOURCE_BYTES} a saved action's file may have" in await _refused(
        tmp_path, impl=big
    )


async def test_an_existing_action_is_refused_without_overwrite(tmp_path: Path) -> None:
    existing = tmp_path / "gentools" / "demo" / "greet"
    existing.mkdir(parents=True)
    (existing / "api.py").write_text(API)
    message = await _refused(tmp_path)
    assert "gentools/demo/greet/ exists: pass overwrite=true to replace the action demo.greet" in message
    assert sorted(p.name for p in existing.parent.iterdir()) == ["greet"]


async def test_a_module_the_action_or_its_category_would_shadow_is_refused(tmp_path: Path) -> None:
    gentools = tmp_path / "gentools"
    (gentools / "demo").mkdir(parents=True)
    (gentools / "demo" / "greet.py").write_text("X = 1\n")
    assert (
        "gentools/demo/greet.py exists: an action named 'greet' would shadow that module"
        in await _refused(tmp_path)
    )
    (gentools / "other.py").write_text("X = 1\n")
    assert "gentools/other.py exists: a category 'other' would shadow that module" in await _refused(
        tmp_path, "other"
    )
    (gentools / "plain").write_text("")
    assert "gentools/plain exists and is not a directory" in await _refused(tmp_path, "plain")


@pytest.mark.parametrize("planted", ["gentools", "gentools/demo", "gentools/demo/greet"])
async def test_a_planted_symlink_is_refused_and_nothing_is_written_through_it(
    tmp_path: Path, planted: str
) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    outside.mkdir()
    link = workspace / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with pytest.raises(SymlinkRefusedError, match="it is a symlink"):
        await save_code_action(
            no_kernel,
            workspace / "mcptools",
            "demo",
            "greet",
            api=API,
            impl=IMPL,
            root=workspace,
            overwrite=True,
        )
    assert list(outside.iterdir()) == []


def test_an_index_line_cannot_break_out_of_its_docstring() -> None:
    hostile = '""" + __import__("os").system("id") + """ \\ end'
    source = _render_category_init("demo", [("greet", hostile), ("plain", "")])
    tree = ast.parse(source)
    assert [type(node).__name__ for node in tree.body] == ["Expr", "Assign"]
    doc = ast.get_docstring(tree)
    assert doc is not None and f"- greet: {hostile}" in doc.splitlines()
    assert "- plain" in doc.splitlines()
    namespace: dict[str, object] = {}
    exec(compile(source, "<index>", "exec"), namespace)
    assert namespace["__all__"] == ["greet", "plain"]


def _write_action(gentools: Path, category: str, name: str, api: str, manifest: object | None) -> Path:
    directory = gentools / category / name
    directory.mkdir(parents=True)
    (directory / "api.py").write_text(api)
    (directory / "impl.py").write_text(IMPL)
    if manifest is not None:
        (directory / layout.ACTION_MANIFEST).write_text(json.dumps(manifest))
    return directory


def _manifest(api: str, **changes: object) -> dict[str, object]:
    manifest: dict[str, object] = {
        "format": 1,
        "ipybox": "0.10.0",
        "api_sha256": hashlib.sha256(api.encode()).hexdigest(),
        "doc": "Greet someone.",
        "signature": "run(params: Params) -> Result",
        "takes_params": True,
        "is_async": False,
        "returns": "Result",
        "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "output_schema": None,
    }
    return {**manifest, **changes}


def test_read_actions_lists_described_actions_and_calls_others_stale(tmp_path: Path) -> None:
    gentools = tmp_path / "gentools"
    _write_action(gentools, "demo", "good", API, _manifest(API))
    _write_action(gentools, "demo", "edited", API + "\n# edited\n", _manifest(API))
    _write_action(gentools, "demo", "missing", API, None)
    _write_action(gentools, "demo", "invalid", API, _manifest(API, takes_params="maybe"))
    _write_action(gentools, "demo", "bad_sha", API, _manifest(API, api_sha256="../../etc/passwd"))
    huge = _write_action(gentools, "demo", "huge", API, None)
    (huge / layout.ACTION_MANIFEST).write_text(" " * (2 << 20) + json.dumps(_manifest(API)))
    # Not actions: no api.py, a name no action can have, a symlinked action and category.
    (gentools / "demo" / "no_api").mkdir()
    _write_action(gentools, "demo", "Not_A_Name", API, _manifest(API))
    (gentools / "demo" / "linked").symlink_to(gentools / "demo" / "good")
    (gentools / "elsewhere").symlink_to(gentools / "demo")

    listing = read_actions(gentools)

    assert [(a.category, a.name) for a in listing.actions] == [("demo", "good")]
    good = listing.actions[0]
    assert (good.module, good.tool_name, good.path) == (
        "gentools.demo.good",
        "demo__good",
        gentools / "demo" / "good",
    )
    assert (good.description, good.signature, good.takes_params) == (
        "Greet someone.",
        "run(params: Params) -> Result",
        True,
    )
    assert sorted(listing.stale) == [
        ("demo", "bad_sha"),
        ("demo", "edited"),
        ("demo", "huge"),
        ("demo", "invalid"),
        ("demo", "missing"),
    ]


def test_read_actions_of_a_missing_directory_lists_none(tmp_path: Path) -> None:
    listing = read_actions(tmp_path / "gentools")
    assert (listing.actions, listing.stale) == ([], [])


@pytest.mark.integration
async def test_stale_actions_are_described_in_one_fresh_kernel_and_their_manifests_rewritten(
    executor: CodeExecutor, tmp_path: Path
) -> None:
    workspace = executor.working_dir
    mcptools = workspace / "mcptools"
    gentools = layout.gentools_dir(mcptools)
    await executor.save_code_action("describe", "first", api=API, impl=IMPL, overwrite=True)
    await executor.save_code_action("describe", "second", api=API, impl=IMPL, overwrite=True)
    (gentools / "describe" / "first" / layout.ACTION_MANIFEST).unlink()
    edited = API.replace('"""Greet someone."""', '"""Greet someone, edited by hand."""')
    (gentools / "describe" / "second" / "api.py").write_text(edited)
    # Edited by hand into code that fails at import, and into code that kills its kernel.
    _write_action(gentools, "describe", "broken", API, None)
    (gentools / "describe" / "broken" / "impl.py").write_text("raise RuntimeError('no')\n")
    (gentools / "describe" / "broken" / "__init__.py").write_text("from .api import run\n")
    assert {("describe", n) for n in ("first", "second", "broken")} <= set(read_actions(gentools).stale)

    stale = [("describe", "first"), ("describe", "second"), ("describe", "broken")]
    described = await describe_actions(executor.check_in_fresh_kernel, mcptools, stale, root=workspace)

    assert sorted((a.name, a.description) for a in described) == [
        ("first", "Greet someone."),
        ("second", "Greet someone, edited by hand."),
    ]
    listing = read_actions(gentools)
    assert {("describe", "first"), ("describe", "second")} <= {(a.category, a.name) for a in listing.actions}
    assert ("describe", "broken") in listing.stale


@pytest.mark.integration
async def test_an_action_that_kills_its_kernel_does_not_keep_the_others_from_being_described(
    executor: CodeExecutor,
) -> None:
    workspace = executor.working_dir
    mcptools = workspace / "mcptools"
    gentools = layout.gentools_dir(mcptools)
    await executor.save_code_action("dying", "fine", api=API, impl=IMPL, overwrite=True)
    (gentools / "dying" / "fine" / layout.ACTION_MANIFEST).unlink()
    killer = _write_action(gentools, "dying", "killer", API, None)
    (killer / "impl.py").write_text("import os\nos._exit(3)\n")
    (killer / "__init__.py").write_text("from .api import run\nfrom . import impl\n")

    stale = [("dying", "killer"), ("dying", "fine")]
    described = await describe_actions(executor.check_in_fresh_kernel, mcptools, stale, root=workspace)

    assert [a.name for a in described] == ["fine"]
