"""Complete outputs and images from the attacker's side: another local user who plants the shared output
directory, and a kernel that replaces the output or images directory, or a directory above it, by a symlink
before the host writes there (issue 12, class 9; issue 30, finding 4: tool results' images too)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipybox import CodeExecutor
from ipybox.kernels.output import OutputCollector
from tests.servers import params
from tests.servers.edge_server import PNG_BYTES

pytestmark = pytest.mark.integration

NOBODY = 65534


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A fresh `$TMPDIR` for this process (short: the gateway's sockets live under it too; `tmp_path`
    first, so pytest's own temporary directories stay where they were)."""
    base = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _plant_shared_dir(base: Path) -> Path:
    """What another local user does: create `$TMPDIR/ipybox-output` first, writable for everyone."""
    shared = base / "ipybox-output"
    shared.mkdir()
    os.chmod(shared, 0o777)
    if os.geteuid() == 0:
        os.chown(shared, NOBODY, NOBODY)
    return shared


def _assert_private(path: Path) -> None:
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
    assert stat.S_IMODE(info.st_mode) == 0o600, oct(info.st_mode)
    parent = path.parent.lstat()
    assert stat.S_ISDIR(parent.st_mode) and parent.st_uid == os.geteuid()
    assert stat.S_IMODE(parent.st_mode) == 0o700, oct(parent.st_mode)


async def test_another_user_who_plants_the_shared_output_dir_receives_no_output(
    short_tmp: Path, tmp_path: Path
) -> None:
    shared = _plant_shared_dir(short_tmp)
    async with CodeExecutor(working_dir=tmp_path, max_output_chars=1000, spare_kernel=False) as executor:
        result = await executor.execute("print('secret ' * 1000)")
    assert result.output_file is not None
    assert list(shared.iterdir()) == [], "the complete output went to a directory another user controls"
    _assert_private(result.output_file)
    assert result.output_file.parent.parent == short_tmp
    # It stays for the user to read after the executor stopped.
    assert result.output_file.read_text().count("secret") == 1000


def test_complete_outputs_get_unpredictable_names_in_a_private_directory(short_tmp: Path) -> None:
    files = []
    for _ in range(2):
        collector = OutputCollector(1000, short_tmp / "images", Path(tempfile.gettempdir()) / "ipybox-output")
        collector.add_text("x" * 2000)
        output_file = collector.result().output_file
        assert output_file is not None
        files.append(output_file)
    assert not (short_tmp / "ipybox-output").exists(), "the shared, predictable directory is not used"
    for output_file in files:
        _assert_private(output_file)
        assert len(output_file.stem) >= 32, "a name another user could guess"
    assert files[0] != files[1]


def test_an_output_dir_a_kernel_replaced_by_a_symlink_receives_no_output(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "outputs").symlink_to(victim)

    collector = OutputCollector(1000, workspace / "images", workspace / "outputs")
    collector.add_text("y" * 2000)
    result = collector.result()

    assert list(victim.iterdir()) == []
    assert result.output_file is not None and result.output_file.read_text() == "y" * 2000
    _assert_private(result.output_file)


def test_images_are_not_written_through_an_images_dir_a_kernel_replaced_by_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "images").symlink_to(victim)

    collector = OutputCollector(1000, workspace / "images", workspace / "outputs")
    collector.add_result({"image/svg+xml": "<svg/>", "text/plain": "<SVG>"})
    result = collector.result()

    assert list(victim.iterdir()) == []
    assert len(result.images) == 1 and result.images[0].read_text() == "<svg/>"
    assert (workspace / "images").is_symlink(), "the symlink is left for the user to look at"


async def test_a_kernel_that_links_a_directory_on_the_images_path_out_of_the_workspace_gets_nothing_written_there(
    tmp_path: Path,
) -> None:
    # The tool server (tool results' images) and the output collector (displayed images) write into
    # `images_dir`; a sandboxed kernel links a directory on its way, then the images dir itself, to a
    # directory outside the workspace that it can't write, and makes both write.
    victim, workspace = tmp_path / "victim", tmp_path / "workspace"
    victim.mkdir()
    (workspace / "out").mkdir(parents=True)  # at the top level, which a kernel can't add to
    show = "from IPython.display import SVG, display\ndisplay(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))"
    call = (
        "from ipybox.in_kernel.tool_runner import ToolRunner\nprint(ToolRunner('edge').run_sync('media', {}))"
    )
    async with CodeExecutor(
        working_dir=workspace,
        images_dir=workspace / "out" / "a" / "images",
        sandbox=True,
        mcp_servers={"edge": params.edge()},
        approve_tool_calls=False,
        spare_kernel=False,
    ) as executor:
        results = []
        for link in ("out/a", "out/a/images"):  # a directory on the way, then the images dir itself
            await executor.execute(
                "import os\nif os.path.islink('out/a'): os.unlink('out/a')\n"
                f"os.makedirs(os.path.dirname({link!r}), exist_ok=True)\nos.symlink({str(victim)!r}, {link!r})"
            )
            assert (workspace / link).is_symlink()
            results.append(await executor.execute(f"{call}\n{show}"))
    assert list(victim.rglob("*")) == [], "the host wrote outside the workspace through the kernel's link"
    for result, link in zip(results, ("out/a", "out/a/images"), strict=True):
        assert result.text is not None
        assert (
            f"[image not saved (image/png, {len(PNG_BYTES)} bytes): {workspace / link} is a symlink"
            in result.text
        )
        [image] = result.images  # the displayed image, in the private output directory instead
        assert image.read_text().startswith("<svg") and not image.is_relative_to(workspace)


def test_output_files_in_a_given_output_dir_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    collector = OutputCollector(10, tmp_path / "images", tmp_path / "outputs")
    collector.add_text("z" * 100)
    result = collector.result()
    assert result.output_file is not None and result.output_file.parent == tmp_path / "outputs"
    _assert_private(result.output_file)
