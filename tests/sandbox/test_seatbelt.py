"""The macOS sandbox's profile and command line, checked on Linux: nothing here runs `sandbox-exec`.

Profiles are read back with a small reader of the SBPL subset ipybox writes (TinyScheme's string escapes:
`\\\\` and `\\"`), so the tests see the rules `sandbox-exec` would see, not substrings of the text.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import ipybox.sandbox
from ipybox.sandbox import SandboxPolicy, SandboxUnavailableError, bwrap, doctor, sbpl, seatbelt
from ipybox.sandbox.command import sandboxed
from ipybox.sandbox.kernel_launch import SandboxedKernelLaunch
from ipybox.sandbox.seatbelt import SANDBOX_EXEC, seatbelt_command, seatbelt_kernel_launch, seatbelt_profile

# A kernel command line, and a placeholder for a directory known only when a kernel starts (as the
# gateway's kernelspec has one for its runtime dir).
KERNEL = ("python", "-m", "kernel", "-f", "{connection_file}")
PLACEHOLDER = "{runtime_dir}"


class Text(str):
    """A string literal in a profile (symbols are plain `str`)."""


Form = str | list["Form"]


def read_sbpl(source: str) -> list[Form]:
    """The top-level forms of a profile."""
    forms: list[Form] = []
    stack: list[list[Form]] = [forms]
    i = 0
    while i < len(source):
        char = source[i]
        if char == ";":
            i = source.index("\n", i)
        elif char == "(":
            stack.append([])
        elif char == ")":
            done = stack.pop()
            stack[-1].append(done)
        elif char == '"':
            chars, i = [], i + 1
            while source[i] != '"':
                if source[i] == "\\":
                    i += 1
                chars.append(source[i])
                i += 1
            stack[-1].append(Text("".join(chars)))
        elif not char.isspace():
            end = i
            while end < len(source) and not source[end].isspace() and source[end] not in '()";':
                end += 1
            stack[-1].append(source[i:end])
            i = end - 1
        i += 1
    assert len(stack) == 1, "unbalanced parentheses"
    return forms


def rules(profile: str, action: str, operation: str) -> list[tuple[int, list[str], list[Form]]]:
    """(position, operations, filters) of each rule `(action ... operation ... filters...)`."""
    found = []
    for index, form in enumerate(read_sbpl(profile)):
        assert isinstance(form, list)
        operations = [item for item in form[1:] if isinstance(item, str) and not isinstance(item, Text)]
        if form[0] == action and operation in operations:
            found.append((index, operations, [item for item in form[1:] if isinstance(item, list)]))
    return found


def only_rule(profile: str, action: str, operations: str) -> tuple[int, list[Form]]:
    """(position, filters) of the one rule `(action operations filters...)`, operations exactly those."""
    found = [
        (at, filters)
        for at, ops, filters in rules(profile, action, operations.split()[0])
        if ops == operations.split()
    ]
    assert len(found) == 1, found
    return found[0]


def real(path: Path | str) -> str:
    return os.path.realpath(path)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("private key\n")
    return home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "parent" / "ws"
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / ".env").write_text("KEY=secret\n")
    (tmp_path / "parent" / ".env.shared").write_text("OTHER=secret\n")
    return workspace


@pytest.fixture
def no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sandbox-exec` counts as working: the command line is built, never run."""
    monkeypatch.setattr(seatbelt, "check_seatbelt", lambda: SANDBOX_EXEC)


def kernel_launch(
    workspace: Path, policy: SandboxPolicy | None = None, **kwargs: Path | None
) -> SandboxedKernelLaunch:
    runtime = Path(PLACEHOLDER)
    return seatbelt_kernel_launch(
        KERNEL,
        policy or SandboxPolicy(),
        workspace,
        ipc_dir=runtime / "ipc",
        temp_dir=runtime / "tmp",
        placeholder=PLACEHOLDER,
        **kwargs,
    )


def profile_for(
    workspace: Path, home: Path, policy: SandboxPolicy | None = None, **kwargs: list[Path]
) -> str:
    temp = workspace.parent / "tmp"
    return seatbelt_profile(policy or SandboxPolicy(), workspace, temp_dir=temp, home=home, **kwargs)


# --- the profile ----------------------------------------------------------------------------------------


def test_profile_denies_by_default_then_allows_reads(workspace: Path, home: Path) -> None:
    forms = read_sbpl(profile_for(workspace, home))
    assert forms[:2] == [["version", "1"], ["deny", "default"]]
    assert ["allow", "file-read*"] in forms
    assert ["allow", "default"] not in forms
    # Nothing gives a hidden file a second name.
    assert not rules(profile_for(workspace, home), "allow", "file-link")
    assert not rules(profile_for(workspace, home), "allow", "file-clone")


def test_credential_stores_and_env_files_are_hidden_even_before_they_exist(
    workspace: Path, home: Path
) -> None:
    _, filters = only_rule(profile_for(workspace, home), "deny", "file-read* file-write*")
    assert ["subpath", Text(real(home / ".ssh"))] in filters  # exists
    assert ["subpath", Text(str(home / ".aws"))] in filters  # doesn't exist (yet)
    assert ["subpath", Text(str(home / ".docker" / "config.json"))] in filters
    assert ["literal", Text(real(workspace / ".env"))] in filters
    patterns = [item[1] for item in filters if item[0] == "regex"]
    workspace_text = real(workspace)

    def hidden(path: str) -> bool:
        return any(re.fullmatch(pattern, path) for pattern in patterns)

    assert hidden(f"{workspace_text}/.env.created-later")
    assert hidden(f"{workspace_text}/.envdir/inside")
    assert hidden(f"{real(workspace.parent)}/.env.shared")
    assert hidden("/.env")
    assert not hidden(f"{workspace_text}/env")
    assert not hidden(f"{workspace_text}/config.env")
    assert not hidden(f"{workspace_text}/sub/.env")  # as on Linux: the workspace and its parents only


def test_policy_deny_read_entries_are_hidden_and_read_only(
    tmp_path: Path, workspace: Path, home: Path
) -> None:
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (workspace / "token.txt").write_text("t\n")
    policy = SandboxPolicy.model_validate(
        {"filesystem": {"denyRead": [str(secrets_dir), "token.txt", "~/.private", "/nowhere/yet"]}}
    )
    # Hidden paths are read-only too, as under bubblewrap (where they are read-only mounts).
    _, hidden = only_rule(profile_for(workspace, home, policy), "deny", "file-read* file-write*")
    assert ["subpath", Text(real(secrets_dir))] in hidden  # a directory: all under it
    assert ["literal", Text(real(workspace / "token.txt"))] in hidden  # a file: exactly it
    assert ["subpath", Text(str(home / ".private"))] in hidden
    assert ["subpath", Text("/nowhere/yet")] in hidden


def test_symlinks_are_hidden_under_both_names(tmp_path: Path, workspace: Path, home: Path) -> None:
    target = tmp_path / "vault"
    target.mkdir()
    (home / ".aws").symlink_to(target)
    outside = tmp_path / "outside.env"
    outside.write_text("KEY=elsewhere\n")
    (workspace / ".env.link").symlink_to(outside)
    _, hidden = only_rule(profile_for(workspace, home), "deny", "file-read* file-write*")
    assert ["subpath", Text(str(home / ".aws"))] in hidden
    assert ["subpath", Text(real(target))] in hidden
    # Seatbelt checks where a symlink leads: the file it names is hidden itself.
    assert ["literal", Text(real(outside))] in hidden


def test_writes_only_to_the_workspace_the_process_dirs_and_devices(
    tmp_path: Path, workspace: Path, home: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    policy = SandboxPolicy.model_validate({"filesystem": {"allowWrite": [str(out)]}})
    ipc = tmp_path / "ipc"
    profile = profile_for(workspace, home, policy, writable=[ipc])
    _, filters = only_rule(profile, "allow", "file-write*")
    subpaths = {item[1] for item in filters if item[0] == "subpath"}
    assert subpaths == {real(workspace), real(out), real(workspace.parent / "tmp"), real(ipc)}
    literals = {item[1] for item in filters if item[0] == "literal"}
    assert literals == {"/dev/null", "/dev/zero", "/dev/tty", "/dev/dtracehelper"}
    assert [item for item in filters if item[0] == "regex"] == [["regex", Text("^/dev/fd/[0-9]+$")]]
    assert not rules(profile, "allow", "file-write-data")
    assert not rules(profile, "allow", "file-write-create")


def test_deny_write_comes_after_allow_write(workspace: Path, home: Path) -> None:
    policy = SandboxPolicy.model_validate({"filesystem": {"denyWrite": ["reports/final"]}})
    profile = profile_for(workspace, home, policy)
    allow_at, _ = only_rule(profile, "allow", "file-write*")
    deny_at, read_only = only_rule(profile, "deny", "file-write*")
    # In SBPL the last matching rule decides: a deny must follow the allow it narrows.
    assert deny_at > allow_at
    assert ["subpath", Text(real(workspace / ".git"))] in read_only  # hooks, config: all of it
    assert ["subpath", Text(real(workspace / "ipybox.toml"))] in read_only  # can't be created either
    assert ["subpath", Text(real(workspace / ".env"))] not in read_only  # hidden, below
    assert ["subpath", Text(real(workspace / "reports" / "final"))] in read_only
    hide_at, _ = only_rule(profile, "deny", "file-read* file-write*")
    assert hide_at > allow_at
    # Nor can their directories be moved away and back: `mv .git g`, edit g/config, `mv g .git`.
    unlink_at, pinned = only_rule(profile, "deny", "file-write-unlink")
    assert unlink_at > allow_at
    assert ["literal", Text(real(workspace))] in pinned  # .git itself is read-only, its directory pinned
    assert ["literal", Text(real(workspace / "reports"))] in pinned
    assert ["literal", Text("/")] not in pinned


def test_network_is_denied_but_the_named_unix_sockets(tmp_path: Path, workspace: Path, home: Path) -> None:
    tools, ipc = tmp_path / "tools", tmp_path / "ipc"
    profile = profile_for(workspace, home, writable=[ipc], sockets=[tools])
    forms = read_sbpl(profile)
    network = [form for form in forms if any(str(item).startswith("network") for item in form[1:])]
    assert network[0] == ["deny", "network*"]
    assert forms.index(network[0]) < min(forms.index(form) for form in network[1:])
    for form in network[1:]:
        assert form[0] == "allow"
        assert isinstance(form[-1], list) and form[-1][1] == "unix-socket", form
    connect = {form[-1][2][1] for form in network if "network-outbound" in form}
    assert connect == {real(tools), real(ipc), real(workspace.parent / "tmp")}
    bind = {form[-1][2][1] for form in network if "network-bind" in form}
    assert bind == {real(ipc), real(workspace.parent / "tmp")}
    assert "(remote ip" not in profile and "(local ip" not in profile and "(remote tcp" not in profile


@pytest.mark.parametrize(
    "name",
    [
        '")(allow default)(',
        'a\\"(allow network*)',
        "ends-with-backslash\\",
        "semi;(allow file-write*)",
        "q\"'",
    ],
)
def test_hostile_paths_come_out_as_strings(tmp_path: Path, home: Path, name: str) -> None:
    workspace = tmp_path / name / "ws"
    workspace.mkdir(parents=True)
    (workspace / ".env").write_text("KEY=secret\n")
    hostile = tmp_path / f"deny-{name}"
    hostile.mkdir()
    policy = SandboxPolicy.model_validate({"filesystem": {"denyRead": [str(hostile)]}})
    profile = seatbelt_profile(policy, workspace, temp_dir=tmp_path / "tmp", home=home)
    benign_workspace = tmp_path / "plain" / "ws"
    benign_workspace.mkdir(parents=True)
    (benign_workspace / ".env").write_text("KEY=secret\n")
    (tmp_path / "deny-plain").mkdir()
    benign = seatbelt_profile(
        SandboxPolicy.model_validate({"filesystem": {"denyRead": [str(tmp_path / "deny-plain")]}}),
        benign_workspace,
        temp_dir=tmp_path / "tmp",
        home=home,
    )
    forms = read_sbpl(profile)
    # The same rules as for ordinary names, each path one string that reads back exactly.
    assert [form[:2] for form in forms] == [form[:2] for form in read_sbpl(benign)]
    assert ["allow", "default"] not in forms
    assert ["allow", "network*"] not in forms
    _, hidden = only_rule(profile, "deny", "file-read* file-write*")
    assert ["subpath", Text(real(hostile))] in hidden
    assert ["literal", Text(real(workspace / ".env"))] in hidden
    _, writable = only_rule(profile, "allow", "file-write*")
    assert ["subpath", Text(real(workspace))] in writable


def test_regex_metacharacters_in_paths_match_only_themselves(tmp_path: Path, home: Path) -> None:
    workspace = tmp_path / "a.b+(c)[d]{2}|e$^"
    workspace.mkdir()
    profile = seatbelt_profile(SandboxPolicy(), workspace, temp_dir=tmp_path / "tmp", home=home)
    _, hidden = only_rule(profile, "deny", "file-read* file-write*")
    pattern = next(item[1] for item in hidden if item[0] == "regex")
    assert re.fullmatch(pattern, f"{real(workspace)}/.env")
    assert not re.fullmatch(pattern, f"{real(tmp_path)}/aXb+(c)[d]{{2}}|e$^/.env")
    assert not re.fullmatch(pattern, f"{real(tmp_path)}/a.bb(c)[d]{{2}}|e$^/.env")


def test_glob_characters_in_the_workspace_path_are_not_patterns(tmp_path: Path, home: Path) -> None:
    workspace = tmp_path / "a[b]*"
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "keys").mkdir()
    (workspace / "keys" / "one.key").write_text("k\n")
    (tmp_path / "ab").mkdir()  # what a[b] would match as a glob
    policy = SandboxPolicy.model_validate({"filesystem": {"denyRead": ["keys/*.key"]}})
    profile = seatbelt_profile(policy, workspace, temp_dir=tmp_path / "tmp", home=home)
    _, read_only = only_rule(profile, "deny", "file-write*")
    assert ["subpath", Text(real(workspace / ".git"))] in read_only
    assert ["subpath", Text(real(workspace / "ipybox.toml"))] in read_only
    _, hidden = only_rule(profile, "deny", "file-read* file-write*")
    assert ["literal", Text(real(workspace / "keys" / "one.key"))] in hidden  # the entry's glob, expanded


def test_control_characters_are_refused(tmp_path: Path, home: Path) -> None:
    workspace = tmp_path / "line\nbreak"
    workspace.mkdir()
    with pytest.raises(SandboxUnavailableError, match="control character"):
        seatbelt_profile(SandboxPolicy(), workspace, temp_dir=tmp_path / "tmp", home=home)


def test_a_rule_that_lost_its_filters_is_dropped() -> None:
    assert sbpl.rule("allow", "file-write*", []) == []
    assert sbpl.rule("deny", "file-read*", ['(subpath "/x")']) == ["(deny file-read*", '  (subpath "/x"))']


# --- the command line and the kernelspec ----------------------------------------------------------------


@pytest.mark.usefixtures("no_probe")
def test_command_line(tmp_path: Path, workspace: Path, home: Path) -> None:
    temp = tmp_path / "tmp"
    argv = seatbelt_command(["node", "server.js"], SandboxPolicy(), workspace, temp_dir=temp, home=home)
    assert argv[:2] == [SANDBOX_EXEC, "-p"]
    assert read_sbpl(argv[2])[:2] == [["version", "1"], ["deny", "default"]]
    assert argv[3:5] == ["/bin/sh", "-c"]
    assert argv[6:] == ["ipybox-sandbox", str(temp), real(workspace), "node", "server.js"]
    assert "-D" not in argv  # no parameter without a runtime-dir placeholder


@pytest.mark.integration
def test_launcher_makes_a_private_temp_dir_and_execs(tmp_path: Path, workspace: Path, no_probe: None) -> None:
    """The part of the command line after the profile, run here without sandbox-exec."""
    base = tmp_path / "runtime" / "tmp"
    (tmp_path / "runtime").mkdir()
    script = "import os, tempfile; print(json.dumps([tempfile.gettempdir(), os.getcwd(), dict(os.environ)]))"
    argv = seatbelt_command(
        [sys.executable, "-c", f"import json; {script}"], SandboxPolicy(), workspace, temp_dir=base
    )
    launcher = argv[argv.index("/bin/sh") :]
    runs = [subprocess.run(launcher, capture_output=True, text=True, check=True) for _ in range(2)]
    (temp_1, cwd, env), (temp_2, _, _) = (json.loads(run.stdout) for run in runs)
    assert Path(temp_1).parent == base and Path(temp_2).parent == base and temp_1 != temp_2
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert stat.S_IMODE(Path(temp_1).stat().st_mode) == 0o700
    assert cwd == real(workspace)
    assert env["IPYTHONDIR"] == f"{temp_1}/.ipython" and env["MPLCONFIGDIR"] == f"{temp_1}/.matplotlib"


@pytest.mark.usefixtures("no_probe")
def test_allowed_domains_are_refused_on_macos(workspace: Path) -> None:
    policy = SandboxPolicy.model_validate({"network": {"allowedDomains": ["pypi.org"]}})
    with pytest.raises(SandboxUnavailableError, match="allowedDomains is not supported"):
        seatbelt_command(["true"], policy, workspace, temp_dir=workspace)
    with pytest.raises(SandboxUnavailableError, match="allowedDomains is not supported"):
        kernel_launch(workspace, policy)


@pytest.mark.usefixtures("no_probe")
def test_a_kernel_launch_wraps_the_kernel_and_names_the_placeholder_dir_by_a_parameter(
    tmp_path: Path, workspace: Path, home: Path
) -> None:
    tools = tmp_path / "tools"
    launch = kernel_launch(workspace, tool_server_dir=tools, home=home)
    assert launch.interrupt_mode == "signal"  # sandbox-exec and the launcher exec: the kernel has the pid
    assert launch.resources == {}
    assert launch.argv[:3] == (SANDBOX_EXEC, "-D", f"IPYBOX_RUNTIME_DIR={PLACEHOLDER}")
    assert launch.argv[-len(KERNEL) :] == KERNEL
    profile = launch.argv[launch.argv.index("-p") + 1]
    assert PLACEHOLDER not in profile  # the directory is a parameter, never profile text
    assert [
        "allow",
        "network-outbound",
        ["remote", "unix-socket", ["subpath", Text(real(tools))]],
    ] in read_sbpl(profile)
    # Filling in the placeholder in every argument (as Jupyter does a kernelspec's) fills in the profile's
    # parameter and the launcher's temp dir with it.
    runtime = "/var/folders/xy/T/ipybox-gateway-1"
    argv = [arg.replace(PLACEHOLDER, runtime) for arg in launch.argv]
    assert argv[2] == f"IPYBOX_RUNTIME_DIR={runtime}"
    assert argv[argv.index("ipybox-sandbox") + 1] == f"{runtime}/tmp"


@pytest.mark.usefixtures("no_probe")
def test_a_command_without_the_placeholder_gets_no_parameter(workspace: Path, home: Path) -> None:
    argv = seatbelt_command(
        ["true"], SandboxPolicy(), workspace, temp_dir=workspace / "tmp", home=home, placeholder=PLACEHOLDER
    )
    assert "-D" not in argv and "param" not in argv[argv.index("-p") + 1]


@pytest.mark.usefixtures("no_probe")
def test_runtime_dir_is_allowed_as_spelled_and_under_private(
    tmp_path: Path, workspace: Path, home: Path
) -> None:
    launch = kernel_launch(workspace, home=home)
    _, writable = only_rule(launch.argv[launch.argv.index("-p") + 1], "allow", "file-write*")
    param = ["param", Text("IPYBOX_RUNTIME_DIR")]
    assert ["subpath", ["string-append", param, Text("/ipc")]] in writable
    assert ["subpath", ["string-append", Text("/private"), param, Text("/ipc")]] in writable
    assert ["subpath", ["string-append", param, Text("/tmp")]] in writable


@pytest.mark.usefixtures("no_probe")
def test_a_kernel_launch_refuses_paths_jupyter_would_rewrite(tmp_path: Path, home: Path) -> None:
    workspace = tmp_path / "{connection_file}"
    workspace.mkdir()
    with pytest.raises(SandboxUnavailableError, match="connection_file"):
        kernel_launch(workspace, home=home)


@pytest.mark.usefixtures("no_probe")
def test_a_kernel_launch_refuses_paths_its_own_placeholder_would_rewrite(tmp_path: Path, home: Path) -> None:
    workspace = tmp_path / "@RUNTIME@"
    workspace.mkdir()
    runtime = Path("@RUNTIME@")
    with pytest.raises(SandboxUnavailableError, match="@RUNTIME@"):
        seatbelt_kernel_launch(
            KERNEL,
            SandboxPolicy(),
            workspace,
            ipc_dir=runtime / "ipc",
            temp_dir=runtime / "tmp",
            placeholder="@RUNTIME@",
            home=home,
        )


# --- platform dispatch, fail-closed checks, doctor ------------------------------------------------------


@pytest.mark.usefixtures("no_probe")
def test_dispatch_picks_seatbelt_on_macos(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert ipybox.sandbox.check_sandbox() == SANDBOX_EXEC
    launch = ipybox.sandbox.sandboxed_kernel_launch(
        KERNEL, SandboxPolicy(), workspace, ipc_dir=workspace / "ipc", temp_dir=workspace / "tmp"
    )
    assert launch.argv[0] == SANDBOX_EXEC and launch.interrupt_mode == "signal"
    argv = ipybox.sandbox.sandboxed_command(["true"], SandboxPolicy(), workspace, temp_dir=workspace)
    assert argv[0] == SANDBOX_EXEC and argv[-1] == "true"
    with pytest.raises(ValueError, match="temp_dir"):
        ipybox.sandbox.sandboxed_command(["true"], SandboxPolicy(), workspace)


def test_dispatch_picks_bubblewrap_on_linux(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(bwrap, "check_sandbox", lambda: "/usr/bin/bwrap")
    monkeypatch.setattr(seatbelt, "check_seatbelt", lambda: pytest.fail("seatbelt on Linux"))
    assert ipybox.sandbox.check_sandbox() == "/usr/bin/bwrap"
    launch = ipybox.sandbox.sandboxed_kernel_launch(
        KERNEL, SandboxPolicy(), workspace, ipc_dir=workspace / "ipc", temp_dir=workspace / "tmp"
    )
    # Kernels start through the launcher, which builds the view per kernel and execs bubblewrap.
    assert launch.argv[1:4] == ("-P", "-m", "ipybox.sandbox.launch")
    assert launch.argv[-len(KERNEL) - 1 :] == ("--", *KERNEL)
    plan = json.loads(launch.resources["sandbox.json"])
    assert plan["bwrap"] == "/usr/bin/bwrap" and "--unshare-all" in plan["namespaces"]
    assert launch.interrupt_mode == "message"
    argv = ipybox.sandbox.sandboxed_command(["true"], SandboxPolicy(), workspace, temp_dir=workspace)
    assert argv == bwrap.sandboxed_command(["true"], SandboxPolicy(), workspace)


def test_other_platforms_fail_closed(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    message = r"needs Linux \(bubblewrap\) or macOS \(sandbox-exec\); this is Windows"
    with pytest.raises(SandboxUnavailableError, match=message):
        ipybox.sandbox.check_sandbox()
    with pytest.raises(SandboxUnavailableError, match=message):
        ipybox.sandbox.sandboxed_kernel_launch(
            KERNEL, SandboxPolicy(), workspace, ipc_dir=workspace, temp_dir=workspace
        )
    with pytest.raises(SandboxUnavailableError, match=message):
        ipybox.sandbox.sandboxed_command(["true"], SandboxPolicy(), workspace, temp_dir=workspace)


def test_check_seatbelt_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    real_access = os.access
    present = {"sandbox-exec": False}
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode: present["sandbox-exec"] if path == SANDBOX_EXEC else real_access(path, mode),
    )
    with pytest.raises(SandboxUnavailableError, match="needs /usr/bin/sandbox-exec"):
        seatbelt.check_seatbelt.__wrapped__()

    present["sandbox-exec"] = True
    probes: list[list[str]] = []
    answer = {"returncode": 71, "stderr": "sandbox-exec: sandbox_apply: Operation not permitted\n"}

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        probes.append(argv)
        return subprocess.CompletedProcess(argv, answer["returncode"], "", str(answer["stderr"]))

    monkeypatch.setattr(seatbelt.subprocess, "run", run)
    with pytest.raises(SandboxUnavailableError, match=r"sandbox_apply: Operation not permitted.*nested"):
        seatbelt.check_seatbelt.__wrapped__()
    # The probe applies a real profile (so one this macOS can't compile fails here) to /usr/bin/true.
    assert probes[0][0] == SANDBOX_EXEC and probes[0][-1] == "/usr/bin/true"
    assert read_sbpl(probes[0][probes[0].index("-p") + 1])[1] == ["deny", "default"]
    # The rules on a directory named by parameter, which kernel profiles have, are in the probe's too.
    assert probes[0][1] == "-D" and probes[0][2].startswith("IPYBOX_RUNTIME_DIR=/")
    assert '(param "IPYBOX_RUNTIME_DIR")' in probes[0][probes[0].index("-p") + 1]
    answer.update(returncode=0, stderr="")
    assert seatbelt.check_seatbelt.__wrapped__() == SANDBOX_EXEC


def test_doctor_on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    real_access = os.access
    present = {"sandbox-exec": True}
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode: present["sandbox-exec"] if path == SANDBOX_EXEC else real_access(path, mode),
    )

    def nested() -> str:
        raise SandboxUnavailableError("sandbox-exec cannot apply ipybox's profile here (nested)")

    monkeypatch.setattr(doctor, "check_seatbelt", functools.cache(nested))
    checks = doctor.run_checks()
    assert [(check.name, check.ok) for check in checks] == [
        ("sandbox-exec", True),
        ("Seatbelt profile", False),
    ]
    assert "nested" in checks[1].detail and not doctor.sandbox_ready(checks)
    present["sandbox-exec"] = False
    checks = doctor.run_checks()
    assert [(check.name, check.ok) for check in checks] == [("sandbox-exec", False)]


@pytest.mark.usefixtures("no_probe")
async def test_sandboxed_command_gets_a_temp_dir_for_its_lifetime_on_macos(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    async with sandboxed(["server"], SandboxPolicy(), workspace) as argv:
        temp = Path(argv[argv.index("ipybox-sandbox") + 1])
        assert temp.is_dir()
        _, writable = only_rule(argv[argv.index("-p") + 1], "allow", "file-write*")
        assert ["subpath", Text(real(temp))] in writable
    assert not temp.exists()
