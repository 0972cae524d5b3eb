"""`ipybox init` and `ipybox schema`, run in process through `ipybox.cli.main.main`: the written
`ipybox.toml` loads with the real loader for every choice of options, its rules decide as their comments
say, and nothing is overwritten, duplicated or half-written."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from ipybox.cli import init as init_module
from ipybox.cli.init import GITIGNORE_LINE, render_config
from ipybox.cli.main import main
from ipybox.config import load_config
from ipybox.config.schema import EXAMPLE_URL, SCHEMA_ID, WORKSPACE_SCHEMA, example_path, schema_path
from ipybox.config.server_catalog import CATALOG, regex_escape
from ipybox.limits import WorkspaceLimits
from ipybox.rules.calls import ToolCall

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "ipybox.toml"
NAMES = list(CATALOG)


@pytest.fixture(autouse=True)
def _no_ipybox_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # IPYBOX_* variables override the file and would change what loads.
    for name in list(os.environ):
        if name.upper().startswith("IPYBOX_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _sandbox_probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # `ipybox init` asks `ipybox doctor`'s checks whether this machine can sandbox, which starts a test
    # sandbox (a process): only the tests about that answer run the real checks (`real_probe`); for the
    # others the answer is "yes", which changes nothing in the file.
    if "real_probe" not in request.fixturenames:
        monkeypatch.setattr(init_module, "_sandbox_available", lambda: True)


@pytest.fixture
def real_probe() -> None:
    """The test runs `ipybox doctor`'s real checks."""


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "ws"


def init(*args: str | Path) -> int:
    return main(["init", *(str(arg) for arg in args)])


def test_init_writes_an_ipybox_toml_that_validates(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert init(workspace) == 0
    out = capsys.readouterr().out
    assert f"Wrote {workspace / 'ipybox.toml'} (sandbox on, servers: none yet)" in out
    assert f"ipybox up -w {workspace}" in out and f"ipybox server add NAME -w {workspace}" in out
    assert main(["validate", str(workspace)]) == 0
    config = load_config(workspace)
    assert config.sandbox.enabled and config.enabled_servers() == {}
    assert config.approval.default == "ask"


def test_init_creates_the_directory_with_its_parents(tmp_path: Path) -> None:
    workspace = tmp_path / "a" / "b" / "ws"
    assert init(workspace) == 0
    assert sorted(os.listdir(workspace)) == [".gitignore", ".ipybox", "ipybox.toml"]


def test_init_without_a_directory_writes_into_the_current_one(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace.mkdir()
    monkeypatch.chdir(workspace)
    assert main(["init"]) == 0
    assert (workspace / "ipybox.toml").is_file()
    assert "  ipybox up   run the workspace" in capsys.readouterr().out


OPTION_SETS = [
    *([name] for name in NAMES),
    NAMES,
    [],
]


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no-sandbox"])
@pytest.mark.parametrize("servers", OPTION_SETS, ids=lambda names: "+".join(names) or "none")
def test_every_choice_of_servers_and_sandbox_validates(
    workspace: Path, servers: list[str], sandbox: bool
) -> None:
    options = [arg for name in servers for arg in ("--server", name)]
    assert init(workspace, *options, *([] if sandbox else ["--no-sandbox"])) == 0
    assert main(["validate", str(workspace)]) == 0
    config = load_config(workspace)
    assert sorted(config.enabled_servers()) == sorted(servers)
    assert config.sandbox.enabled is sandbox
    for name in servers:
        written = config.servers[name].model_dump(exclude_unset=True, by_alias=True)
        assert {key: written[key] for key in CATALOG[name].params} == CATALOG[name].params


def test_a_default_limit_this_machine_cannot_enforce_is_lifted_in_the_file_saying_why(
    workspace: Path,
) -> None:
    workspace.mkdir()
    why = "setrlimit counts mapped memory only, and an unsandboxed process can keep files in /dev/shm"
    text = render_config(workspace, sandbox=False, lifted={"memory": why})
    assert f'# {why}\nmemory = "unlimited"' in text
    (workspace / "ipybox.toml").write_text(text)
    limits = load_config(workspace).kernel.limits
    assert limits.memory is None and limits.processes == WorkspaceLimits().processes
    assert "\n[kernel.limits]" not in render_config(workspace, sandbox=False, lifted={})


def test_a_server_named_twice_is_written_once(workspace: Path) -> None:
    assert init(workspace, "--server", "time", "--server", "time") == 0
    assert (workspace / "ipybox.toml").read_text().count("\n[servers.time]\n") == 1


def test_the_rules_decide_as_their_comments_say(workspace: Path) -> None:
    assert init(workspace, "--server", "fetch") == 0
    policy = load_config(workspace).approval
    here = str(workspace.resolve())
    read_only = {"readOnlyHint": True, "openWorldHint": False}

    def decision(server: str, tool: str, annotations: dict[str, bool] | None = None, **args: object) -> str:
        return policy.decide(ToolCall(server, tool, dict(args), annotations or {})).decision

    assert decision("filesystem", "read_text_file", read_only, path="notes.md") == "allow"
    assert decision("time", "get_current_time", read_only, timezone="UTC") == "allow"
    assert decision("filesystem", "write_file", path="out/a.md", content="") == "ask"
    assert decision("filesystem", "write_file", path=f"{here}/out/a.md", content="") == "ask"
    assert decision("filesystem", "write_file", path="/etc/passwd", content="") == "deny"
    assert decision("filesystem", "read_text_file", read_only, path="~/.ssh/id_rsa") == "deny"
    assert decision("filesystem", "list_directory", read_only, path=here) == "allow"
    assert decision("filesystem", "write_file", path=f"{here}/../x", content="") == "deny"
    assert decision("filesystem", "write_file", path=f"{here}-other/x", content="") == "deny"
    assert decision("fetch", "fetch", read_only, url="https://example.com") == "ask"
    assert decision("fetch", "fetch", {"readOnlyHint": True, "openWorldHint": True}, url="https://x") == "ask"
    assert decision("memory", "delete_entities", entityNames=[]) == "ask"


def test_the_rules_refuse_the_names_the_host_acts_on_in_every_spelling(workspace: Path) -> None:
    # An attack: through the filesystem server, read what the kernel's sandbox hides, or replace what the
    # host runs from (a read-only tool is allowed without asking, a write would be asked).
    assert init(workspace, "--server", "filesystem", "--server", "git") == 0
    policy = load_config(workspace).approval
    here = str(workspace.resolve())
    read_only = {"readOnlyHint": True, "openWorldHint": False}

    def decision(tool: str, annotations: dict[str, bool] | None = None, **args: object) -> str:
        return policy.decide(ToolCall("filesystem", tool, dict(args), annotations or {})).decision

    spellings = [
        "ipybox.toml",
        "./ipybox.toml",
        ".//./ipybox.toml",
        f"{here}/ipybox.toml",
        f"{here}//./ipybox.toml",
    ]
    for path in [*spellings, "out/../ipybox.toml", f"{here}/out/../ipybox.toml"]:
        assert decision("write_file", path=path, content="") == "deny", path
        assert decision("edit_file", path=path, edits=[]) == "deny", path
        assert decision("move_file", source="out/x", destination=path) == "deny", path
    for path in [".env", ".env.local", "./.ipybox/state.json", f"{here}/.ipybox/state.json", ".git/config"]:
        assert decision("read_text_file", read_only, path=path) == "deny", path
        assert decision("move_file", source=path, destination="out/x") == "deny", path
    assert decision("write_file", path="mcptools/fs/__init__.py", content="") == "deny"
    # Below the top level the names are ordinary files; lists of paths are asked.
    assert decision("write_file", path="out/ipybox.toml", content="") == "ask"
    assert decision("read_text_file", read_only, path="out/.env") == "allow"
    assert decision("read_multiple_files", read_only, paths=["notes.md", ".env"]) == "ask"
    # The git server stays on the workspace's repository (a kernel can make a .git, with hooks, below it).
    git = ToolCall("git", "git_commit", {"repo_path": "out", "message": "x"}, {})
    assert policy.decide(git).decision == "deny"
    assert policy.decide(ToolCall("git", "git_status", {"repo_path": here}, read_only)).decision == "allow"


def test_the_filesystem_server_runs_sandboxed_and_init_says_what_to_install(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert init(workspace, "--server", "filesystem") == 0
    assert load_config(workspace).server_params("filesystem")["sandbox"]  # no path of its is the kernel's
    assert capsys.readouterr().err == (
        "ipybox: note: `mcp-server-filesystem` is not on PATH, so the server filesystem can't start until "
        "it is (run `npm install -g @modelcontextprotocol/server-filesystem`: the server runs in a sandbox "
        "without network, so npx can't fetch it)\n"
    )


@pytest.mark.parametrize("name", ["my [ws] *?", "quote \"and' back\\slash", "line\nbreak"])
def test_the_workspace_rules_hold_for_any_directory_name(tmp_path: Path, name: str) -> None:
    workspace = tmp_path / name
    assert init(workspace) == 0
    policy = load_config(workspace).approval  # loading checks the rules' match examples, path included
    here = str(workspace.resolve())
    inside = ToolCall("filesystem", "write_file", {"path": f"{here}/a.md", "content": ""}, {})
    beside = ToolCall("filesystem", "write_file", {"path": f"{here}x/a.md", "content": ""}, {})
    assert policy.decide(inside).decision == "ask"
    assert policy.decide(beside).decision == "deny"


def test_init_refuses_to_overwrite_an_existing_ipybox_toml(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace.mkdir()
    existing = workspace / "ipybox.toml"
    existing.write_text("# mine\n")
    assert init(workspace, "--server", "time") == 1
    err = capsys.readouterr().err
    assert err == f"ipybox: {existing} already exists: edit it, or pass --force to replace it\n"
    assert existing.read_text() == "# mine\n"
    assert sorted(os.listdir(workspace)) == ["ipybox.toml"]


def test_init_refuses_a_dangling_symlink_too(workspace: Path) -> None:
    workspace.mkdir()
    (workspace / "ipybox.toml").symlink_to(workspace / "elsewhere.toml")
    assert init(workspace) == 1
    assert not (workspace / "elsewhere.toml").exists()


def test_force_replaces_the_file_and_leaves_no_temporary_file(workspace: Path) -> None:
    workspace.mkdir()
    (workspace / "ipybox.toml").write_text("# mine\n")
    assert init(workspace, "--force", "--server", "time") == 0
    assert "time" in load_config(workspace).enabled_servers()
    assert sorted(os.listdir(workspace)) == [".gitignore", ".ipybox", "ipybox.toml"]


def test_an_unknown_server_is_one_error_that_lists_the_known_names(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        init(workspace, "--server", "time", "--server", "nope")
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("ipybox init: error: --server 'nope': not an example server (known: ")
    assert all(name in error for name in NAMES) and "ipybox server add NAME" in error
    assert not workspace.exists()


def test_a_file_in_the_way_of_the_directory_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ws").write_text("")
    assert init(tmp_path / "ws") == 1
    assert (
        capsys.readouterr().err
        == f"ipybox: {tmp_path / 'ws'} is not a directory: name a new or existing directory\n"
    )


def test_gitignore_is_created_with_the_state_directory(workspace: Path) -> None:
    assert init(workspace) == 0
    assert (workspace / ".gitignore").read_text() == f"{GITIGNORE_LINE}\n"


@pytest.mark.parametrize("existing", ["node_modules/", "node_modules/\n", "# nothing\n\n"])
def test_gitignore_gets_the_line_appended_on_a_line_of_its_own(workspace: Path, existing: str) -> None:
    workspace.mkdir()
    (workspace / ".gitignore").write_text(existing)
    assert init(workspace) == 0
    separator = "" if existing.endswith("\n") else "\n"  # what was there stays byte for byte
    assert (workspace / ".gitignore").read_text() == existing + separator + f"{GITIGNORE_LINE}\n"


@pytest.mark.parametrize("line", [".ipybox/", ".ipybox", "/.ipybox/", "  /.ipybox  "])
def test_gitignore_that_already_ignores_the_state_directory_is_left_alone(workspace: Path, line: str) -> None:
    workspace.mkdir()
    (workspace / ".gitignore").write_text(f"dist/\n{line}\n")
    assert init(workspace) == 0
    assert init(workspace, "--force") == 0
    assert (workspace / ".gitignore").read_text() == f"dist/\n{line}\n"


def test_the_written_file_names_no_path_of_this_machine_and_a_copy_elsewhere_works(
    tmp_path: Path,
) -> None:
    workspace = (tmp_path / "ws").resolve()
    assert init(workspace, "--server", "filesystem", "--server", "git") == 0
    text = (workspace / "ipybox.toml").read_text()
    # Nothing of this machine: not the workspace, not where ipybox is installed.
    for path in (str(tmp_path), regex_escape(str(tmp_path)), str(schema_path().parent), sys.prefix):
        assert path not in text, path
    # The schema line names the workspace's copy, which init wrote (as every start does), git-ignored.
    lines = text.splitlines()
    assert lines[0] == f"#:schema ./{WORKSPACE_SCHEMA}"
    assert (workspace / WORKSPACE_SCHEMA).read_bytes() == schema_path().read_bytes()
    assert json.loads(schema_path().read_text())["$id"] == SCHEMA_ID
    assert (workspace / ".ipybox" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert f"# {EXAMPLE_URL}" in lines and example_path().is_file()

    # Committed and checked out elsewhere (without .ipybox/): it loads, and its rules hold for the new place.
    elsewhere = (tmp_path / "checkout").resolve()
    shutil.copytree(workspace, elsewhere, ignore=shutil.ignore_patterns(".ipybox"))
    policy = load_config(elsewhere).approval
    inside = ToolCall("filesystem", "write_file", {"path": f"{elsewhere}/notes.md", "content": ""})
    outside = ToolCall("filesystem", "write_file", {"path": f"{workspace}/notes.md", "content": ""})
    assert policy.decide(inside).rule_id != "filesystem-stays-in-workspace"
    assert policy.decide(outside).rule_id == "filesystem-stays-in-workspace"
    git = ToolCall("git", "git_status", {"repo_path": str(elsewhere)})
    assert policy.decide(git).decision != "deny"


def _normalised(text: str, workspace: Path) -> str:
    return text.replace(str(workspace.resolve()), "<WORKSPACE>").replace(
        regex_escape(str(workspace.resolve())), "<WORKSPACE>"
    )


def test_the_default_file_is_the_golden_one(workspace: Path) -> None:
    """The default `ipybox.toml`, byte for byte (regenerate: `python -m tests.cli.test_init`)."""
    assert init(workspace) == 0
    assert _normalised((workspace / "ipybox.toml").read_text(), workspace) == GOLDEN.read_text()


def _uncommented_limits(text: str) -> str:
    """The commented-out `[kernel.limits]` block of `text`, uncommented: the table line and its `key = value`
    lines (comment lines between them, which explain the keys, are left out)."""
    lines = text.splitlines()
    start = lines.index("# [kernel.limits]")
    block = ["[kernel.limits]"]
    for line in lines[start + 1 :]:
        if not line.startswith("#"):
            break
        if re.fullmatch(r"# [a-z_]+ = .+", line):
            block.append(line.removeprefix("# "))
    return "\n".join(block) + "\n"


@pytest.mark.parametrize("source", ["template", "example"])
def test_the_commented_limits_block_uncommented_loads_as_the_workspace_defaults(
    source: str, workspace: Path
) -> None:
    if source == "template":
        assert init(workspace) == 0
        text = (workspace / "ipybox.toml").read_text()
    else:
        workspace.mkdir()
        text = example_path().read_text()
    block = _uncommented_limits(text)
    keys = {line.split(" = ")[0] for line in block.splitlines()[1:]}
    assert {"memory", "cpus", "processes", "open_files", "tmp"} <= keys  # every limit is shown
    (workspace / "ipybox.toml").write_text(block)
    assert load_config(workspace).kernel.limits == WorkspaceLimits()


def test_without_a_sandbox_here_the_file_still_asks_for_it_and_says_so(
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    real_probe: None,
) -> None:
    if sys.platform != "linux":
        pytest.skip("takes bubblewrap off PATH: Linux's sandbox")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no bwrap: `ipybox doctor`'s checks fail, starting nothing
    assert init(workspace) == 0
    assert load_config(workspace).sandbox.enabled
    err = capsys.readouterr().err
    assert "can't sandbox kernels (`ipybox doctor` says what is missing)" in err
    assert "ipybox init --no-sandbox --force" in err


def test_a_chosen_server_whose_command_is_not_on_path_gets_a_note(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert init(workspace, "--no-sandbox", "--server", "time", "--server", "github") == 0
    err = capsys.readouterr().err
    assert err == (
        "ipybox: note: `uvx` is not on PATH, so the server time can't start until it is "
        "(install uv, which brings uvx)\n"
    )


@pytest.mark.integration
def test_where_the_sandbox_works_init_adds_no_note(
    workspace: Path, capsys: pytest.CaptureFixture[str], real_probe: None
) -> None:
    from ipybox.sandbox.doctor import run_checks, sandbox_ready

    if not sandbox_ready(run_checks()):
        pytest.skip("this machine can't sandbox: `ipybox doctor`")
    assert init(workspace) == 0
    assert capsys.readouterr().err == ""


def test_no_sandbox_writes_false_and_no_note(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert init(workspace, "--no-sandbox") == 0
    assert not load_config(workspace).sandbox.enabled
    captured = capsys.readouterr()
    assert captured.err == "" and "sandbox off" in captured.out


@pytest.mark.parametrize(("option", "title"), [([], "ipybox.toml"), (["--sandbox-policy"], "sandbox policy")])
def test_schema_prints_the_path_of_an_installed_json_schema(
    option: list[str], title: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema", *option]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_absolute() and path.is_relative_to(Path(__import__("ipybox").__file__).parent)
    schema = json.loads(path.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and title in schema["title"]


def test_render_config_refuses_a_name_outside_the_catalog(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        render_config(tmp_path, ["nope"])


def test_every_pair_of_servers_renders_distinct_active_tables(tmp_path: Path) -> None:
    for pair in itertools.combinations(NAMES, 2):
        text = render_config(tmp_path, pair)
        active = [line for line in text.splitlines() if line.startswith("[servers.")]
        assert active == [f"[servers.{name}]" for name in NAMES if name in pair]


@pytest.mark.integration
def test_the_wheel_holds_the_example_the_schemas_and_the_template(ipybox_wheel: Path) -> None:
    wheel = ipybox_wheel  # built once per run (tests/pip_installed.py)
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in [
        "ipybox/data/ipybox.toml.example",
        "ipybox/data/schemas/ipybox.schema.json",
        "ipybox/data/schemas/sandbox-policy.schema.json",
        "ipybox/data/templates/ipybox.toml.jinja",
    ]:
        assert name in names
        assert zipfile.ZipFile(wheel).read(name) == (ROOT / name).read_bytes()


if __name__ == "__main__":  # regenerate the golden file
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        target = Path(directory) / "ws"
        main(["init", str(target)])
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(_normalised((target / "ipybox.toml").read_text(), target))
        print(f"wrote {GOLDEN}")
