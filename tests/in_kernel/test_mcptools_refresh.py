"""A running kernel sees tool packages regenerated, added and removed after it started, without a restart:
the `mcptools_refresh` extension that `kernel_main` loads when `IPYBOX_MCPTOOLS_DIR` is set."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.in_kernel.mcptools_refresh import MCPTOOLS_DIR_ENV, PARSERS_PACKAGE, MCPToolsRefresher
from ipybox.reconcile.generations import Generations, delete_retired, retire_package

pytestmark = pytest.mark.integration


def write_package(mcptools: Path, name: str, value: int) -> None:
    """Write `mcptools/<name>` the way the reconciler does: complete in a staging directory, then renamed
    into place (over the old package)."""
    mcptools.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=mcptools))
    (staging / "__init__.py").write_text(f"VALUE = {value}\n")
    (staging / "tool.py").write_text(f"def run() -> int:\n    return {value}\n")
    target = mcptools / name
    if target.exists():
        retired = retire_package(mcptools, name)
        assert retired is not None
        os.rename(staging, target)
        delete_retired(retired)
    else:
        os.rename(staging, target)


def mark(
    mcptools: Path,
    generations: Generations,
    changed: list[str] | None = None,
    removed: list[str] | None = None,
) -> None:
    """Write the generation marker as the reconciler does after changing packages."""
    generations.bump(changed=changed or [], removed=removed or [])
    generations.write(mcptools)


@pytest.fixture(scope="module")
def refresh_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refresh-workspace")


@pytest.fixture(scope="module")
async def refreshing_executor(refresh_workspace: Path) -> AsyncIterator[CodeExecutor]:
    mcptools = refresh_workspace / "mcptools"
    write_package(mcptools, "a", 1)
    Generations(1, {"a": 1}).write(mcptools)
    async with CodeExecutor(
        working_dir=refresh_workspace,
        kernel_env={MCPTOOLS_DIR_ENV: str(mcptools)},
        spare_kernel=False,
    ) as executor:
        yield executor


async def run(executor: CodeExecutor, code: str) -> str:
    return (await executor.execute(code)).text or ""


async def test_a_regenerated_package_is_imported_anew_by_the_next_cell(
    refreshing_executor: CodeExecutor, refresh_workspace: Path
) -> None:
    mcptools = refresh_workspace / "mcptools"
    generations = Generations.read(mcptools)
    assert (
        await run(
            refreshing_executor, "import mcptools.a.tool\nprint(mcptools.a.VALUE, mcptools.a.tool.run())"
        )
        == "1 1"
    )

    write_package(mcptools, "a", 2)
    mark(mcptools, generations, changed=["a"])

    assert (
        await run(
            refreshing_executor, "import mcptools.a.tool\nprint(mcptools.a.VALUE, mcptools.a.tool.run())"
        )
        == "2 2"
    )
    # `from mcptools import a` takes the parent package's attribute when it has one: that went too.
    write_package(mcptools, "a", 3)
    mark(mcptools, generations, changed=["a"])
    assert await run(refreshing_executor, "from mcptools import a\nprint(a.VALUE)") == "3"


async def test_a_package_created_after_the_kernel_started_is_importable(
    refreshing_executor: CodeExecutor, refresh_workspace: Path
) -> None:
    mcptools = refresh_workspace / "mcptools"
    generations = Generations.read(mcptools)
    result = await refreshing_executor.execute(
        "import mcptools.a\ntry:\n    import mcptools.b\nexcept ImportError as e:\n    print(type(e).__name__)"
    )
    assert result.text == "ModuleNotFoundError"

    write_package(mcptools, "b", 10)
    mark(mcptools, generations, changed=["b"])

    assert await run(refreshing_executor, "import mcptools.b\nprint(mcptools.b.VALUE)") == "10"


async def test_a_removed_package_is_gone_from_the_kernel(
    refreshing_executor: CodeExecutor, refresh_workspace: Path
) -> None:
    mcptools = refresh_workspace / "mcptools"
    generations = Generations.read(mcptools)
    write_package(mcptools, "gone", 5)
    mark(mcptools, generations, changed=["gone"])
    assert await run(refreshing_executor, "import mcptools.gone.tool\nprint(mcptools.gone.VALUE)") == "5"

    retired = retire_package(mcptools, "gone")
    assert retired is not None
    delete_retired(retired)
    mark(mcptools, generations, removed=["gone"])

    code = "import sys\ntry:\n    import mcptools.gone\nexcept ImportError:\n    print('gone', [m for m in sys.modules if 'gone' in m])"
    assert await run(refreshing_executor, code) == "gone []"


async def test_unchanged_packages_keep_their_modules(
    refreshing_executor: CodeExecutor, refresh_workspace: Path
) -> None:
    mcptools = refresh_workspace / "mcptools"
    generations = Generations.read(mcptools)
    write_package(mcptools, "steady", 1)
    write_package(mcptools, "moving", 1)
    mark(mcptools, generations, changed=["steady", "moving"])
    await run(
        refreshing_executor,
        "import mcptools.steady, mcptools.moving\nids = id(mcptools.steady), id(mcptools.moving)",
    )

    write_package(mcptools, "moving", 2)
    mark(mcptools, generations, changed=["moving"])

    code = "import mcptools.steady, mcptools.moving\nprint(id(mcptools.steady) == ids[0], id(mcptools.moving) == ids[1])"
    assert await run(refreshing_executor, code) == "True False"


async def test_the_refresh_is_installed_only_when_asked_for(
    refreshing_executor: CodeExecutor, executor: CodeExecutor
) -> None:
    code = "print([type(c).__name__ for c in get_ipython().events.callbacks['pre_run_cell']])"
    assert "MCPToolsRefresher" in await run(refreshing_executor, code)
    assert "MCPToolsRefresher" not in await run(executor, code)


@pytest.fixture
def package_root(tmp_path: Path) -> Iterator[Path]:
    """An importable directory with a `mcptools` package root, for the refresher in this process."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path / "mcptools"
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m == "mcptools" or m.startswith("mcptools.")]:
        del sys.modules[name]
    shutil.rmtree(tmp_path / "mcptools", ignore_errors=True)


def test_the_marker_is_read_only_when_it_changed(package_root: Path) -> None:
    generations = Generations()
    write_package(package_root, "a", 1)
    mark(package_root, generations, changed=["a"])
    refresher = MCPToolsRefresher(package_root)
    assert refresher.generations == {"a": 1}
    assert refresher.refresh() == []

    write_package(package_root, "b", 1)
    mark(package_root, generations, changed=["b"])
    assert refresher.refresh() == ["b"]
    assert refresher.refresh() == []

    mark(package_root, generations, changed=["a"], removed=["b"])
    assert refresher.refresh() == ["a", "b"]
    assert refresher.generations == {"a": 3}


def test_a_missing_or_broken_marker_never_fails_a_cell(package_root: Path) -> None:
    write_package(package_root, "a", 1)
    refresher = MCPToolsRefresher(package_root)  # no marker yet
    assert refresher.generations == {}
    import mcptools.a  # type: ignore[import-not-found]

    assert mcptools.a.VALUE == 1
    (package_root / ".ipybox-generation").write_text("{not json")
    refresher(None)
    assert refresher.generations == {}
    Generations(1, {"a": 1}).write(package_root)
    assert refresher.refresh() == ["a"]
    assert "mcptools.a" not in sys.modules


def test_a_regenerated_package_takes_its_parsers_with_it(package_root: Path) -> None:
    # Generated modules import `mcpparse.<server>.<module>`: after a regeneration (a parser saved, in a
    # workspace) the next import reads the parser from disk too; other servers' parsers stay.
    parsers = package_root.parent / PARSERS_PACKAGE
    for server in ("a", "b"):
        (parsers / server).mkdir(parents=True)
        (parsers / server / "tool.py").write_text("VALUE = 1\n")
    generations = Generations()
    write_package(package_root, "a", 1)
    write_package(package_root, "b", 1)
    mark(package_root, generations, changed=["a", "b"])
    refresher = MCPToolsRefresher(package_root)
    try:
        importlib.import_module("mcpparse.a.tool")
        kept = importlib.import_module("mcpparse.b.tool")
        (parsers / "a" / "tool.py").write_text("VALUE = 22\n")  # another size: no stale bytecode
        mark(package_root, generations, changed=["a"])
        assert refresher.refresh() == ["a"]
        assert "mcpparse.a.tool" not in sys.modules and "mcpparse.a" not in sys.modules
        assert sys.modules["mcpparse.b.tool"] is kept
        from mcpparse.a import tool  # type: ignore[import-not-found]

        assert tool.VALUE == 22

        mark(package_root, generations, removed=["b"])
        assert refresher.refresh() == ["b"]
        assert not [name for name in sys.modules if name.startswith("mcpparse.b")]
    finally:
        for name in [m for m in sys.modules if m == PARSERS_PACKAGE or m.startswith(f"{PARSERS_PACKAGE}.")]:
            del sys.modules[name]
