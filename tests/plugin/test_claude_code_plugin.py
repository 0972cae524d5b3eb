"""The Claude Code plugins of this repository (`.claude-plugin/marketplace.json`, `plugins/<plugin>/`), read
as files and used by the real Claude Code CLI.

The file tests are fast and start nothing. The others run `claude` from npm (`@anthropic-ai/claude-code`,
which `bash scripts/setup` installs into `.cache/npm-clients`) the way a user does, offline and without an
account: with a throwaway `HOME` it adds a copy of this repository's plugin files as a local marketplace
(a directory: Claude Code takes git marketplaces only from https URLs or GitHub), installs a plugin, and
`claude mcp list` in a project directory health-checks the plugin's MCP server, which is `ipybox mcp` from
this venv (first on `PATH`). A health check writes nothing into a project that is no workspace yet (the
workspace starts at the first tool call; one with an `ipybox.toml` starts in the background), and a server
that can't serve the project says why in `claude mcp list`'s line (the JSON-RPC error of `initialize`).
Measured here: `plugin marketplace add` and `plugin install` take 0.3-0.6 s each.

How Claude Code stops a stdio server after the health check (measured, 2.1.330): SIGINT, SIGTERM 100 ms
later, SIGKILL 400 ms after that, to the server's pid only. The tests wait until no process of the
project is left (ipybox's gateway and kernels included).

Without npm (so no CLI could be installed) the CLI tests skip with that reason; with npm but no CLI they
fail: run `bash scripts/setup`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

import ipybox
from ipybox.codeact.layout import GENTOOLS, MCPPARSE, action_tool_name
from ipybox.mcp_server.workspace_mcp import create_server
from ipybox.running.state import StatePaths, remove_leftovers
from ipybox.sandbox.container import NESTING_FLAGS
from ipybox.sandbox.doctor import run_checks, sandbox_ready
from tests.servers.params import CACHE

ROOT = Path(__file__).resolve().parents[2]
MARKETPLACE = ROOT / ".claude-plugin" / "marketplace.json"
PLUGINS = ROOT / "plugins"
CLAUDE = CACHE / "npm-clients" / "node_modules" / ".bin" / "claude"
# Each plugin that runs the installed `ipybox` command, and the options it gives `ipybox mcp` after
# `--workspace <project dir>`.
PLUGIN_OPTIONS = {"codeact-default": [], "codeact-sandbox": ["--sandbox"]}
# The plugin that runs ipybox's container image instead (built by scripts/docker-build), and its command.
DOCKER_PLUGIN = "codeact-docker"
DOCKER_IMAGE = "ipybox"
DOCKER_ARGS = ["run", "-i", "--rm", "-v", "${CLAUDE_PROJECT_DIR}:/workspace", DOCKER_IMAGE]
SKILL = Path("skills") / "codeact" / "SKILL.md"
# The tools the skill is about; the rest of the server's tools must be named in it too.
CODEACT_TOOLS = ["execute_ipython_cell", "register_mcp_server", "save_code_action", "search_tools"]
MARKER_ENV = "IPYBOX_PLUGIN_TEST"


# -- the files ------------------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    assert path.is_file() and not path.is_symlink(), f"{path.relative_to(ROOT)} must be a regular file"
    return json.loads(path.read_text())


def marketplace_plugins() -> dict[str, Path]:
    """The marketplace's plugins by name, with their directories."""
    return {entry["name"]: ROOT / entry["source"] for entry in read_json(MARKETPLACE)["plugins"]}


def front_matter(path: Path) -> dict[str, str]:
    """The `key: value` lines between the `---` lines that open a SKILL.md."""
    lines = path.read_text().splitlines()
    assert lines[0] == "---", f"{path} must start with YAML front matter"
    end = lines.index("---", 1)
    return dict(line.split(": ", 1) for line in lines[1:end])


def test_the_marketplace_lists_the_default_and_sandbox_plugins_each_with_its_directory() -> None:
    marketplace = read_json(MARKETPLACE)
    assert marketplace["name"] == "ipybox"
    assert marketplace["owner"]["name"]
    plugins = marketplace_plugins()
    assert list(plugins) == [*PLUGIN_OPTIONS, DOCKER_PLUGIN]
    for entry in marketplace["plugins"]:
        assert entry["source"].startswith("./plugins/") and entry["description"]
        # What each needs: the command on PATH, or the image.
        needs = "scripts/docker-build" if entry["name"] == DOCKER_PLUGIN else "PATH"
        assert "ipybox" in entry["description"] and needs in entry["description"]
    for name, directory in plugins.items():
        manifest = read_json(directory / ".claude-plugin" / "plugin.json")
        assert manifest["name"] == name
        needs = "scripts/docker-build" if name == DOCKER_PLUGIN else "from a checkout"
        assert needs in manifest["description"]
        assert (directory / "README.md").is_file()


def test_each_plugin_runs_ipybox_mcp_on_the_project_directory() -> None:
    plugins = marketplace_plugins()
    for name in PLUGIN_OPTIONS:
        directory = plugins[name]
        servers = read_json(directory / ".mcp.json")["mcpServers"]
        # The installed `ipybox` command, never a download at run time (`uvx ipybox`).
        assert servers == {
            "ipybox": {
                "command": "ipybox",
                "args": ["mcp", "--workspace", "${CLAUDE_PROJECT_DIR}", *PLUGIN_OPTIONS[name]],
            }
        }, name


def test_the_plugins_carry_the_version_of_the_ipybox_they_describe() -> None:
    # Claude Code caches an installed plugin by its version: a new ipybox needs a new plugin version.
    semver = ipybox.__version__.replace(".dev", "-dev")  # PEP 440 0.10.0.dev0 -> semver 0.10.0-dev0
    for name, directory in marketplace_plugins().items():
        version = read_json(directory / ".claude-plugin" / "plugin.json")["version"]
        assert version == semver, (
            f"plugins/{name}: set its version to {semver} (ipybox's {ipybox.__version__})"
        )


def test_each_plugin_has_the_codeact_skill_as_a_file_of_its_own() -> None:
    skills = {name: directory / SKILL for name, directory in marketplace_plugins().items()}
    for name, skill in skills.items():
        # A copy, not a link: an installed plugin loads a symlink only if it points inside the plugin.
        assert (
            not (skill.parents[1]).is_symlink() and not skill.parent.is_symlink() and not skill.is_symlink()
        )
        meta = front_matter(skill)
        assert meta["name"] == "codeact", name
        assert len(meta["description"]) > 40, name
    # One source, codeact-default's; the others are copies (scripts/sync-skill makes them).
    source = skills["codeact-default"].read_text()
    stale = [name for name, skill in skills.items() if skill.read_text() != source]
    assert stale == [], f"{stale}: the skill differs from codeact-default's: run scripts/sync-skill"


async def test_the_skill_names_every_tool_of_the_ipybox_mcp_server(tmp_path: Path) -> None:
    # The server's built-in tools, as a client lists them (no saved actions in an empty workspace), but
    # the MCP App view's own (`_meta.ui.visibility: ["app"]`), which the model never sees.
    server = create_server(tmp_path).server
    tools = {
        tool.name
        for tool in await MCPServer.list_tools(server)
        if ((tool.meta or {}).get("ui") or {}).get("visibility") != ["app"]
    }
    assert set(CODEACT_TOOLS) <= tools
    text = (PLUGINS / "codeact-default" / SKILL).read_text()
    assert [tool for tool in sorted(tools) if f"`{tool}(" not in text] == []


def test_the_skill_uses_the_layout_ipybox_generates() -> None:
    text = (PLUGINS / "codeact-default" / SKILL).read_text()
    for name in (
        "mcptools/<server>/<tool>.py",
        f"{MCPPARSE}/<server>/<tool>.py",
        f"{GENTOOLS}/<category>/<name>/api.py",
        f"from {GENTOOLS}.<category>.<name> import run, Params",
        f"`{action_tool_name('<category>', '<name>')}`",
        "class ParseResult(BaseModel)",
        "def parse(raw: str) -> ParseResult",
        "run_parsed()",
        "search_tools(",
    ):
        assert name in text, name


# -- the real Claude Code CLI ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def claude() -> Path:
    if not CLAUDE.exists():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so `bash scripts/setup` could not install Claude Code (npm)")
        pytest.fail(
            f"Claude Code is not installed ({CLAUDE} is missing): run `bash scripts/setup`", pytrace=False
        )
    return CLAUDE


@pytest.fixture(scope="module")
def marketplace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this repository's marketplace and plugins, as a user's checkout has them."""
    directory = tmp_path_factory.mktemp("marketplace")
    for name in (".claude-plugin", "plugins"):
        shutil.copytree(ROOT / name, directory / name, symlinks=True)
    return directory


@dataclass
class ClaudeCode:
    """The `claude` command line with a home of its own and this venv's `ipybox` first on `PATH`."""

    cli: Path
    home: Path
    marker: str

    @property
    def env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            # Nothing of a Claude Code session these tests may run in, nor the user's directories.
            if not key.startswith(("CLAUDE", "ANTHROPIC", "XDG_"))
        }
        env.update(
            HOME=str(self.home),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)]),
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
        env[MARKER_ENV] = self.marker
        return env

    def run(self, *args: str, cwd: Path) -> str:
        done = subprocess.run(
            [str(self.cli), *args],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"claude {' '.join(args)} exited with {done.returncode}:\n{output}"
        return output


def install(
    claude: Path, marketplace: Path, plugin: str, tmp_path_factory: pytest.TempPathFactory
) -> ClaudeCode:
    home = tmp_path_factory.mktemp("claude-home")
    home.chmod(0o700)
    cli = ClaudeCode(claude, home, marker=uuid.uuid4().hex)
    added = cli.run("plugin", "marketplace", "add", str(marketplace), cwd=home)
    assert "Successfully added marketplace: ipybox" in added, added
    installed = cli.run("plugin", "install", f"{plugin}@ipybox", cwd=home)
    assert f"Successfully installed plugin: {plugin}@ipybox" in installed, installed
    return cli


def processes_of(project: Path, marker: str) -> dict[int, str]:
    """Processes (but this one) started for `project`: with the marker in their environment (claude,
    `ipybox mcp`), working in the project (the gateway, kernels) or naming it (bubblewrap)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone, or not ours to read
            continue
        if (
            f"{MARKER_ENV}={marker}".encode() in environ
            or Path(cwd).is_relative_to(project)
            or str(project) in cmdline
        ):
            found[int(entry.name)] = cmdline
    return found


@pytest.fixture
def no_process_left() -> Iterator[list[tuple[Path, str]]]:
    """Projects (with their markers) whose processes must all be gone after the test; they get 30 s to
    stop (ipybox's gateway stops its kernels when `ipybox mcp` is killed), then are killed and reported."""
    projects: list[tuple[Path, str]] = []
    yield projects
    for project, marker in projects:
        deadline = time.monotonic() + 30
        while (left := processes_of(project, marker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes of {project} were left behind: {left}"
        # Claude Code kills `ipybox mcp` (SIGTERM 100 ms after SIGINT) before its supervisor has stopped,
        # which leaves its private directories in /tmp until the workspace starts again: remove them as
        # that start would (no supervisor of the project is alive, checked above).
        remove_leftovers(StatePaths(project / ".ipybox"))


def mcp_list(cli: ClaudeCode, project: Path, no_process_left: list[tuple[Path, str]]) -> str:
    no_process_left.append((project, cli.marker))
    return cli.run("mcp", "list", cwd=project)


@pytest.mark.integration
def test_claude_code_validates_the_marketplace_and_the_plugins_strictly(
    claude: Path, marketplace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("claude-home")
    home.chmod(0o700)
    cli = ClaudeCode(claude, home, marker=uuid.uuid4().hex)
    for target in [marketplace, *(marketplace / "plugins" / name for name in PLUGIN_OPTIONS)]:
        report = json.loads(cli.run("plugin", "validate", "--strict", "--json", str(target), cwd=home))
        assert report["success"], report
    # What Claude Code reads from each plugin: the ipybox server and the codeact skill.
    for name, options in PLUGIN_OPTIONS.items():
        report = json.loads(
            cli.run("plugin", "validate", "--json", str(marketplace / "plugins" / name), cwd=home)
        )
        provides = report["provides"]
        assert provides["skills"] == [f"{name}:codeact"]
        [server] = provides["mcpServers"]
        assert (server["name"], server["type"], server["target"]) == ("ipybox", "stdio", "ipybox")
        assert server["args"] == ["mcp", "--workspace", "${CLAUDE_PROJECT_DIR}", *options]


@pytest.mark.integration
def test_codeact_default_installed_in_claude_code_connects_to_the_project_workspace(
    claude: Path,
    marketplace: Path,
    tmp_path_factory: pytest.TempPathFactory,
    no_process_left: list[tuple[Path, str]],
) -> None:
    cli = install(claude, marketplace, "codeact-default", tmp_path_factory)
    project = tmp_path_factory.mktemp("project").resolve()
    (project / "ipybox.toml").write_text('[workspace]\nname = "plugin-test"\n\n[sandbox]\nenabled = false\n')

    listing = mcp_list(cli, project, no_process_left)

    line = f"plugin:codeact-default:ipybox: ipybox mcp --workspace {project} - ✔ Connected"
    assert line in listing.splitlines(), listing
    assert "Failed" not in listing, listing


@pytest.mark.integration
def test_codeact_sandbox_installed_in_claude_code_connects_with_sandboxed_kernels(
    claude: Path,
    marketplace: Path,
    tmp_path_factory: pytest.TempPathFactory,
    no_process_left: list[tuple[Path, str]],
) -> None:
    checks = run_checks()
    if not sandbox_ready(checks):
        pytest.fail(
            "this machine can't sandbox (see `ipybox doctor`): "
            + "; ".join(
                f"{check.name}: {check.detail}" for check in checks if check.required and not check.ok
            ),
            pytrace=False,
        )
    cli = install(claude, marketplace, "codeact-sandbox", tmp_path_factory)
    project = tmp_path_factory.mktemp("project").resolve()  # no ipybox.toml: not a workspace (yet)
    (project / "README.md").write_text("a project\n")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in [project, *project.iterdir()])

    listing = mcp_list(cli, project, no_process_left)

    line = f"plugin:codeact-sandbox:ipybox: ipybox mcp --workspace {project} --sandbox - ✔ Connected"
    assert line in listing.splitlines(), listing
    assert "Failed" not in listing, listing
    # A health check is no use of the project: nothing was written into it (the first tool call would).
    assert sorted((p.name, p.stat().st_mtime_ns) for p in [project, *project.iterdir()]) == before

    # A project whose configuration turns the sandbox off: the reason is the detail of the failure.
    refusing = tmp_path_factory.mktemp("project").resolve()
    (refusing / "ipybox.toml").write_text("[sandbox]\nenabled = false\n")

    listing = mcp_list(cli, refusing, no_process_left)

    [line] = [line for line in listing.splitlines() if line.startswith("plugin:codeact-sandbox:ipybox:")]
    # Claude Code shows the JSON-RPC error's message, with paths and options `[redacted]`.
    _, _, reason = line.partition(" - ✘ Failed to connect — -32603: ipybox: ")
    assert reason, listing
    assert "ipybox.toml:2:1: sandboxed kernels were asked for" in reason, listing
    assert "this file does not enable the sandbox: set `enabled = true` under [sandbox]" in reason, listing
    assert not (refusing / ".ipybox").exists()


# -- `ipybox connect claude --write`: no plugin, the project's .mcp.json ------------------------------------


@pytest.mark.integration
def test_the_entry_ipybox_connect_claude_writes_connects_a_fresh_workspace(
    claude: Path, tmp_path_factory: pytest.TempPathFactory, no_process_left: list[tuple[Path, str]]
) -> None:
    home = tmp_path_factory.mktemp("claude-home")
    home.chmod(0o700)
    # As a user who approved the project's server once when `claude` asked (else it stays pending).
    (home / ".claude").mkdir()
    (home / ".claude" / "settings.json").write_text('{"enabledMcpjsonServers": ["ipybox"]}')
    cli = ClaudeCode(claude, home, marker=uuid.uuid4().hex)
    project = tmp_path_factory.mktemp("project").resolve()
    ipybox = [str(Path(sys.executable).parent / "ipybox")]
    if not Path(ipybox[0]).exists():  # the unprivileged run's venv has no console script
        ipybox = [sys.executable, "-m", "ipybox.cli"]
    for command in (["init", "--no-sandbox"], ["connect", "claude", "--write"]):
        done = subprocess.run(
            [*ipybox, *command], cwd=project, env=cli.env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr

    listing = mcp_list(cli, project, no_process_left)

    # `ipybox` on PATH is this one: the entry names it bare, as a committed .mcp.json needs.
    assert read_json(project / ".mcp.json") == {
        "mcpServers": {
            "ipybox": {"type": "stdio", "command": "ipybox", "args": ["mcp", "--workspace", str(project)]}
        }
    }
    assert f"ipybox: ipybox mcp --workspace {project} - ✔ Connected" in listing.splitlines(), listing


# -- codeact-docker: ipybox's container image ---------------------------------------------------------------


def test_the_docker_plugin_runs_the_image_on_the_project_directory() -> None:
    servers = read_json(PLUGINS / DOCKER_PLUGIN / ".mcp.json")["mcpServers"]
    # stdin open (-i) for MCP, the container removed when the session ends, the project at /workspace.
    assert servers == {"ipybox": {"command": "docker", "args": DOCKER_ARGS}}


def test_the_image_the_docker_plugin_runs_serves_the_mounted_workspace_over_stdio() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["ipybox", "mcp", "--workspace", "/workspace"]' in dockerfile.splitlines()
    assert "WORKDIR /workspace" in dockerfile.splitlines()
    # scripts/docker-build tags the image with the name the plugin runs.
    assert f"tag=${{1:-{DOCKER_IMAGE}}}" in (ROOT / "scripts" / "docker-build").read_text()


def test_the_docker_plugins_readme_says_how_to_build_the_image_and_what_the_container_leaves_open() -> None:
    readme = " ".join((PLUGINS / DOCKER_PLUGIN / "README.md").read_text().split())
    assert "scripts/docker-build" in readme
    for heading in ("Isolated by the container", "Not isolated", "The project directory", "The network"):
        assert heading in readme, heading
    # The flags it names to nest the sandbox are those ipybox's own error and `ipybox doctor` name.
    assert NESTING_FLAGS in readme


@pytest.fixture(scope="module")
def docker_image() -> str:
    """The image the docker plugin runs, when Docker answers and the image is built (scripts/test-docker)."""
    assert shutil.which("docker") is not None, "docker is not installed: scripts/test-docker installs it"
    inspect = ["docker", "image", "inspect", "--format", "{{.Config.User}}", DOCKER_IMAGE]
    done = subprocess.run(inspect, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"no image {DOCKER_IMAGE!r} (or no Docker daemon): run scripts/test-docker"
    return done.stdout.strip()


def containers_on(project: Path) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "--quiet", "--filter", f"volume={project}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


@pytest.mark.integration
@pytest.mark.docker
def test_codeact_docker_installed_in_claude_code_connects_to_the_image(
    claude: Path, marketplace: Path, docker_image: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cli = install(claude, marketplace, DOCKER_PLUGIN, tmp_path_factory)
    report = json.loads(
        cli.run(
            "plugin",
            "validate",
            "--strict",
            "--json",
            str(marketplace / "plugins" / DOCKER_PLUGIN),
            cwd=cli.home,
        )
    )
    assert report["success"], report
    project = tmp_path_factory.mktemp("project").resolve()  # no ipybox.toml: the image makes one
    if os.geteuid() == 0:  # the image's user stands for the host user it was built for
        uid, _, gid = docker_image.partition(":")
        os.chown(project, int(uid), int(gid or uid))

    listing = cli.run("mcp", "list", cwd=project)

    line = f"plugin:{DOCKER_PLUGIN}:ipybox: docker run -i --rm -v {project}:/workspace {DOCKER_IMAGE} - ✔ Connected"
    assert line in listing.splitlines(), listing
    # A health check is no use of the project: nothing was written into it (the first tool call would
    # create an ipybox.toml with the sandbox off: in the image the container is the boundary).
    assert list(project.iterdir()) == []
    # Claude Code's stop (SIGINT to `docker run`) reaches ipybox in the container, which is then removed.
    deadline = time.monotonic() + 30
    while (left := containers_on(project)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"containers of {project} were left running: {left}"
