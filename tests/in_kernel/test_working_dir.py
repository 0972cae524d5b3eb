"""With `working_dir` given, each cell starts there again, however the previous cell left it, and says so
(`[ipybox] cwd reset to <dir>`, ipybox 0.9.2's wording): the `working_dir` extension that `kernel_main`
loads, run through real `CodeExecutor`s and real kernels."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ipybox import CodeExecutionError, CodeExecutor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def resetting(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CodeExecutor]:
    workspace = tmp_path_factory.mktemp("cwd-reset")
    async with CodeExecutor(working_dir=workspace, spare_kernel=False) as executor:
        yield executor


async def run(executor: CodeExecutor, code: str) -> list[str]:
    return ((await executor.execute(code)).text or "").splitlines()


async def cwd(executor: CodeExecutor) -> str:
    [line] = await run(executor, "import os\nprint(os.getcwd())")
    return line


async def test_a_cell_that_changed_directory_ends_with_the_reset_notice(resetting: CodeExecutor) -> None:
    notice = f"[ipybox] cwd reset to {resetting.working_dir}"
    assert await run(resetting, "import os\nos.chdir('/')\nprint(os.getcwd())") == ["/", notice]
    assert await cwd(resetting) == str(resetting.working_dir)


async def test_cd_magic_is_reset_too(resetting: CodeExecutor, tmp_path: Path) -> None:
    lines = await run(resetting, f"%cd {tmp_path}")
    assert lines[-1] == f"[ipybox] cwd reset to {resetting.working_dir}"
    assert await cwd(resetting) == str(resetting.working_dir)


async def test_a_removed_current_directory_is_left_for_the_working_dir(resetting: CodeExecutor) -> None:
    code = "import os\nos.mkdir('doomed')\nos.chdir('doomed')\nos.rmdir(os.getcwd())"
    assert await run(resetting, code) == [f"[ipybox] cwd reset to {resetting.working_dir}"]
    assert await cwd(resetting) == str(resetting.working_dir)


async def test_a_failing_cell_is_reset_as_well(resetting: CodeExecutor) -> None:
    with pytest.raises(CodeExecutionError) as caught:
        await resetting.execute("import os\nos.chdir('/')\n1 / 0")
    assert caught.value.ename == "ZeroDivisionError"
    assert await cwd(resetting) == str(resetting.working_dir)


async def test_a_cell_that_stays_says_nothing(resetting: CodeExecutor) -> None:
    code = "import os\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')\nos.chdir('..')\nprint('stayed')"
    assert await run(resetting, code) == ["stayed"]


async def test_without_working_dir_a_directory_change_persists(tmp_path: Path) -> None:
    # 0.9.2 reset only a working_dir the caller passed; the executor then runs in the current directory.
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        executor = CodeExecutor(spare_kernel=False)
    finally:
        os.chdir(before)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with executor:
        assert await run(executor, f"import os\nos.chdir({str(elsewhere)!r})") == []
        assert await cwd(executor) == str(elsewhere)
