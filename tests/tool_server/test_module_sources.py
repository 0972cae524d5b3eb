"""`ModuleSources`: what the tool server serves to kernels without the host's files, and what it refuses
(no processes: the files are written here, the requests are the ones a hostile kernel could send)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ipybox.mcp_apigen.package import make_temp_dir
from ipybox.tool_server.module_sources import (
    STAGING_NAME,
    ModuleRefusedError,
    ModuleSource,
    ModuleSources,
    contained,
    module_name_problem,
)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "mcptools" / "time").mkdir(parents=True)
    (ws / "mcptools" / "time" / "__init__.py").write_text("'''time'''\n")
    (ws / "mcptools" / "time" / "now.py").write_text("VALUE = 1\n")
    (ws / "mcptools" / ".ipybox-generation").write_text("{}")
    (ws / "gentools" / "demo" / "greet").mkdir(parents=True)
    (ws / "gentools" / "demo" / "greet" / "__init__.py").write_text("from .api import run\n")
    (ws / "gentools" / "demo" / "greet" / "api.py").write_text("def run(): return 'hi'\n")
    (tmp_path / "secret.py").write_text("SECRET = 'never served'\n")
    return ws


def sources(ws: Path, **kwargs: Any) -> ModuleSources:
    return ModuleSources(
        {"mcptools": ws / "mcptools", "gentools": ws / "gentools", "mcpparse": ws / "mcpparse"}, **kwargs
    )


@pytest.mark.parametrize(
    "name", ["mcptools", "mcptools.time", "gentools.demo.greet.api", "mcptools._private"]
)
def test_dotted_identifiers_are_valid_module_names(name: str) -> None:
    assert module_name_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "mcptools..time",
        "mcptools.time/../../etc",
        "mcptools.../secret",
        "mcptools..ipybox-generation",
        "mcptools.__pycache__",
        "mcptools.time.__init__",
        "mcptools.class",
        "mcptools.tíme",
        "mcptools.time\0",
        "a" * 600,
        7,
        None,
    ],
)
def test_anything_but_dotted_identifiers_is_an_invalid_module_name(name: object) -> None:
    assert module_name_problem(name) is not None


@pytest.mark.parametrize(
    ("path", "inside"),
    [("/ws/mcptools", True), ("/ws/mcptools/x.py", True), ("/ws/mcptools2/x.py", False), ("/ws", False)],
)
def test_containment_is_by_whole_path_components(path: str, inside: bool) -> None:
    assert contained(path, "/ws/mcptools") is inside


def test_a_module_a_package_and_a_namespace_package_resolve_as_the_path_finder_would(workspace: Path) -> None:
    served = sources(workspace)
    root = os.path.realpath(workspace / "mcptools")
    assert served.source("mcptools.time.now") == ModuleSource("VALUE = 1\n", False, f"{root}/time/now.py")
    assert served.source("mcptools.time") == ModuleSource("'''time'''\n", True, f"{root}/time/__init__.py")
    assert served.source("mcptools") == ModuleSource("", True, root)  # no __init__.py: a namespace package
    assert served.source("gentools.demo.greet.api") is not None


def test_a_module_that_does_not_exist_is_none(workspace: Path) -> None:
    served = sources(workspace)
    assert served.source("mcptools.time.later") is None
    assert served.source("mcpparse") is None  # its directory does not exist (yet)


def test_a_tool_server_without_roots_serves_nothing(workspace: Path) -> None:
    with pytest.raises(ModuleRefusedError, match="no modules are served here"):
        ModuleSources({}).source("mcptools.time")


@pytest.mark.parametrize("name", ["os", "ipybox.in_kernel.remote", "secret", "ws.mcptools"])
def test_a_module_outside_the_served_packages_is_refused(workspace: Path, name: str) -> None:
    with pytest.raises(ModuleRefusedError, match="is not in a served package"):
        sources(workspace).source(name)


@pytest.mark.parametrize(
    "name", ["mcptools..secret", "mcptools.time/../../../secret", "mcptools.__pycache__"]
)
def test_a_name_that_could_leave_the_root_is_refused_before_the_disk_is_touched(
    workspace: Path, name: str
) -> None:
    with pytest.raises(ModuleRefusedError):
        sources(workspace).source(name)


def test_a_module_that_is_a_symlink_to_a_file_outside_the_root_is_refused(workspace: Path) -> None:
    (workspace / "mcptools" / "leak.py").symlink_to(workspace.parent / "secret.py")
    with pytest.raises(ModuleRefusedError, match="leads outside") as refused:
        sources(workspace).source("mcptools.leak")
    assert "never served" not in str(refused.value)


def test_a_package_that_is_a_symlink_to_a_directory_outside_the_root_is_refused(workspace: Path) -> None:
    outside = workspace.parent / "outside"
    outside.mkdir()
    (outside / "__init__.py").write_text("SECRET = 1\n")
    (outside / "inner.py").write_text("SECRET = 2\n")
    (workspace / "mcptools" / "evil").symlink_to(outside)
    served = sources(workspace)
    for name in ("mcptools.evil", "mcptools.evil.inner"):
        with pytest.raises(ModuleRefusedError, match="leads outside"):
            served.source(name)


def test_a_symlink_that_stays_inside_the_root_is_followed(workspace: Path) -> None:
    (workspace / "mcptools" / "alias.py").symlink_to(workspace / "mcptools" / "time" / "now.py")
    assert sources(workspace).source("mcptools.alias") == ModuleSource(
        "VALUE = 1\n", False, f"{os.path.realpath(workspace / 'mcptools')}/alias.py"
    )


def test_a_symlink_to_a_file_that_is_not_python_is_refused(workspace: Path) -> None:
    (workspace / "mcptools" / "data.txt").write_text("x")
    (workspace / "mcptools" / "data.py").symlink_to(workspace / "mcptools" / "data.txt")
    with pytest.raises(ModuleRefusedError, match=r"not a \.py file"):
        sources(workspace).source("mcptools.data")


def test_a_fifo_is_refused_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "mcptools" / "pipe.py")
    with pytest.raises(ModuleRefusedError, match="not a regular file"):
        sources(workspace).source("mcptools.pipe")


def test_a_file_over_the_size_bound_is_refused(workspace: Path) -> None:
    (workspace / "mcptools" / "big.py").write_text("x = 1\n" * 1000)
    with pytest.raises(ModuleRefusedError, match="larger than 100 bytes"):
        ModuleSources({"mcptools": workspace / "mcptools"}, max_bytes=100).source("mcptools.big")


def test_a_file_that_is_not_utf8_is_refused(workspace: Path) -> None:
    (workspace / "mcptools" / "latin.py").write_bytes(b"NAME = '\xe9'\n")
    with pytest.raises(ModuleRefusedError, match="not UTF-8"):
        sources(workspace).source("mcptools.latin")


def test_roots_are_checked_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="top-level package name"):
        ModuleSources({"mcp.tools": tmp_path})
    with pytest.raises(ValueError, match="absolute path"):
        ModuleSources({"mcptools": Path("mcptools")})


def test_the_generation_changes_when_a_served_file_is_rewritten_added_or_removed(workspace: Path) -> None:
    served = sources(workspace, generation_ttl=0)
    seen = {served.generation()}
    assert served.generation() in seen  # stable while nothing changes
    now = workspace / "mcptools" / "time" / "now.py"
    steps: list[Callable[[], object]] = [
        lambda: now.write_text("VALUE = 22\n"),
        lambda: (workspace / "gentools" / "demo" / "greet" / "impl.py").write_text("X = 1\n"),
        now.unlink,
        lambda: (workspace / "mcpparse" / "time").mkdir(parents=True),
    ]
    for step in steps:
        step()
        generation = served.generation()
        assert generation not in seen
        seen.add(generation)


def test_the_generation_ignores_hidden_files_and_bytecode(workspace: Path) -> None:
    served = sources(workspace, generation_ttl=0)
    package = workspace / "mcptools" / "time"
    before, mtime = served.generation(), package.stat().st_mtime_ns
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "now.cpython-311.pyc").write_bytes(b"x")
    (package / ".now.py.tmp").write_text("staging")
    (package / "notes.txt").write_text("not python")
    os.utime(package, ns=(mtime, mtime))  # what they changed of the directory itself, put back
    assert served.generation() == before


def test_the_generation_is_reused_within_its_time_to_live(workspace: Path) -> None:
    now = [0.0]
    served = sources(workspace, generation_ttl=0.1, clock=lambda: now[0])
    first = served.generation()
    (workspace / "mcptools" / "time" / "now.py").write_text("VALUE = 3\n")
    now[0] = 0.05
    assert served.generation() == first
    now[0] = 0.2
    assert served.generation() != first


# -- a code action's staging directory (the check of a save in a kernel without the host's files)

STAGING = ".shout.tmp-4242_0123456789ab"


@pytest.fixture
def staged(workspace: Path) -> Path:
    directory = workspace / "gentools" / "loud" / STAGING
    directory.mkdir(parents=True)
    (directory / "__init__.py").write_text("from .api import run\n")
    (directory / "api.py").write_text("def run(): '''Shout.'''\n")
    (directory / "impl.py").write_text("LOUD = True\n")
    return directory


def test_the_staging_name_pattern_matches_the_directories_a_save_makes(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        made = make_temp_dir(fd, ".shout.tmp-")
    finally:
        os.close(fd)
    assert STAGING_NAME.fullmatch(made)
    assert STAGING_NAME.fullmatch(STAGING)


def test_a_staged_package_is_served_from_its_staging_directory_with_origins_under_it(
    workspace: Path, staged: Path
) -> None:
    served = sources(workspace)
    assert served.source("", staged=str(staged)) == ModuleSource(
        "from .api import run\n", True, f"{staged}/__init__.py"
    )
    assert served.source("impl", staged=str(staged)) == ModuleSource(
        "LOUD = True\n", False, f"{staged}/impl.py"
    )
    assert served.source("missing", staged=str(staged)) is None
    # The final place is another package: what is staged never mixes with it.
    assert served.source("gentools.loud.shout") is None


def test_a_staged_package_keeps_the_path_it_was_named_by(
    workspace: Path, staged: Path, tmp_path: Path
) -> None:
    (tmp_path / "link").symlink_to(workspace)  # a workspace reached through a symlink (/tmp on macOS)
    named = tmp_path / "link" / "gentools" / "loud" / STAGING
    found = sources(workspace).source("api", staged=str(named))
    assert found is not None and found.origin == f"{named}/api.py"


def test_a_staging_directory_that_is_gone_serves_nothing(workspace: Path) -> None:
    (workspace / "gentools" / "loud").mkdir(parents=True)
    gone = workspace / "gentools" / "loud" / STAGING
    assert sources(workspace).source("", staged=str(gone)) is None


def hidden_targets(workspace: Path) -> dict[str, Path]:
    """Directories a hostile kernel could name as staged, each holding a readable `__init__.py` and
    `x.py` with `SECRET` in them."""
    outside = workspace.parent / "outside"
    gentools, loud = workspace / "gentools", workspace / "gentools" / "loud"
    targets = {
        "a .env-like hidden directory": loud / ".env",
        "another hidden directory": loud / ".cache",
        "another kind of work directory": loud / ".shout.old-4242_0123456789ab",
        "a staging name with an upper-case hex part": loud / ".shout.tmp-4242_0123456789AB",
        "a staging directory directly in gentools": gentools / STAGING,
        "a staging directory in a hidden category": gentools / ".loud" / STAGING,
        "a staging directory in a nested category": loud / "deeper" / STAGING,
        "a staging directory in another root": workspace / "mcptools" / "time" / STAGING,
        "a staging directory outside the roots": outside / "loud" / STAGING,
    }
    for directory in targets.values():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "__init__.py").write_text("SECRET = 'never served'\n")
        (directory / "x.py").write_text("SECRET = 'never served'\n")
    # Symlinks that resolve outside, or elsewhere inside: named like a staging directory, or on its way.
    (loud / ".shout.tmp-1_aaaaaaaaaaaa").symlink_to(outside / "loud" / STAGING)
    (gentools / "evil").symlink_to(outside / "loud")
    targets["a staging-named symlink leading outside"] = loud / ".shout.tmp-1_aaaaaaaaaaaa"
    targets["a category that is a symlink leading outside"] = gentools / "evil" / STAGING
    (gentools / "alias").symlink_to(loud)
    (loud / ".shout.tmp-2_bbbbbbbbbbbb").symlink_to(loud / ".env")
    targets["a category that is a symlink inside"] = gentools / "alias" / STAGING
    targets["a staging-named symlink to a hidden directory inside"] = loud / ".shout.tmp-2_bbbbbbbbbbbb"
    return targets


@pytest.mark.parametrize(
    "what",
    [
        "a .env-like hidden directory",
        "another hidden directory",
        "another kind of work directory",
        "a staging name with an upper-case hex part",
        "a staging directory directly in gentools",
        "a staging directory in a hidden category",
        "a staging directory in a nested category",
        "a staging directory in another root",
        "a staging directory outside the roots",
        "a staging-named symlink leading outside",
        "a category that is a symlink leading outside",
        "a category that is a symlink inside",
        "a staging-named symlink to a hidden directory inside",
    ],
)
def test_a_directory_that_is_not_an_actions_staging_directory_is_refused(
    workspace: Path, staged: Path, what: str
) -> None:
    directory = hidden_targets(workspace)[what]
    served = sources(workspace)
    for module in ("", "x"):
        with pytest.raises(ModuleRefusedError, match="not served") as refused:
            served.source(module, staged=str(directory))
        assert "never served" not in str(refused.value)


@pytest.mark.parametrize(
    "staged_path",
    [
        "gentools/loud/" + STAGING,  # relative
        "{ws}/gentools/loud/../loud/" + STAGING,
        "{ws}/gentools/loud/./" + STAGING,
        "{ws}/gentools/loud//" + STAGING,
        "{ws}/gentools/loud/" + STAGING + "/",
        "{ws}/gentools/loud/" + STAGING + "\0",
        "",
        7,
        ["{ws}"],
    ],
)
def test_a_staged_directory_that_is_not_a_normalized_absolute_path_is_refused(
    workspace: Path, staged: Path, staged_path: object
) -> None:
    if isinstance(staged_path, str):
        staged_path = staged_path.replace("{ws}", str(workspace))
    with pytest.raises(ModuleRefusedError):
        sources(workspace).source("", staged=staged_path)


@pytest.mark.parametrize(
    "module", [".env", "..", "../../secret", "__init__", "__pycache__", "impl/../..", None]
)
def test_a_staged_module_name_that_could_leave_the_directory_is_refused(
    workspace: Path, staged: Path, module: object
) -> None:
    with pytest.raises(ModuleRefusedError):
        sources(workspace).source(module, staged=str(staged))


def test_a_file_in_a_staging_directory_that_is_a_symlink_leaving_the_root_is_refused(
    workspace: Path, staged: Path
) -> None:
    (staged / "leak.py").symlink_to(workspace.parent / "secret.py")
    with pytest.raises(ModuleRefusedError, match="leads outside") as refused:
        sources(workspace).source("leak", staged=str(staged))
    assert "never served" not in str(refused.value)


def test_staged_packages_are_served_only_from_the_gentools_root(workspace: Path, staged: Path) -> None:
    with pytest.raises(ModuleRefusedError, match="no staged code actions are served here"):
        ModuleSources({"mcptools": workspace / "mcptools"}).source("", staged=str(staged))


def test_a_file_in_a_staging_directory_that_is_a_symlink_to_a_hidden_file_of_the_root_is_refused(
    workspace: Path, staged: Path
) -> None:
    hidden = workspace / "gentools" / "loud" / ".env.py"
    hidden.write_text("TOKEN = 'never served'\n")
    (staged / "env.py").symlink_to(hidden)
    (staged / "cache").symlink_to(workspace / "gentools" / "demo" / "greet")
    served = sources(workspace)
    for module in ("env", "cache", "cache.api"):
        with pytest.raises(ModuleRefusedError, match="leads outside") as refused:
            served.source(module, staged=str(staged))
        assert "never served" not in str(refused.value)
