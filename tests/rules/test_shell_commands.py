"""`split_commands`: a shell command line read into the commands it runs, as bash and sh would run them,
and `shell_calls`: a kernel's shell question turned into the calls the rules decide.

Beyond the table of forms, two oracles: real `bash` and `dash` run generated lines with stub programs on
`PATH` that log their names, and every program a shell ran must be one the split decided (or one computed
at run time, which is decided under its unexpanded text).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipybox.rules import SHELL_SERVER, ShellCommand, ShellSyntaxError, ToolCall, shell_calls, split_commands
from ipybox.rules.shell_commands import MAX_NESTING, is_shell_question


def programs(line: str) -> list[str]:
    return [command.program for command in split_commands(line)]


def texts(line: str) -> list[str]:
    return [command.text for command in split_commands(line)]


# --- lists, pipelines, groups ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ls -la", ["ls"]),
        ("ls && rm -rf d", ["ls", "rm"]),
        ("a; b & c | d |& e || f && g", ["a", "b", "c", "d", "e", "f", "g"]),
        ("a\nb\n\nc", ["a", "b", "c"]),
        ("(cd x && rm -rf y)", ["cd", "rm"]),
        ("{ a; b; }", ["a", "b"]),
        ("a;(b)|{ c; }", ["a", "b", "c"]),
        ("if a; then b; elif c; then d; else e; fi", ["a", "b", "c", "d", "e"]),
        ("while a; do b; done; until c; do d; done", ["a", "b", "c", "d"]),
        ("for f in *.txt; do cat $f; done", ["cat"]),
        ("for x do rm x; done", ["rm"]),
        ("case $x in a|b) rm a;; (c) ls;& *) pwd;;& esac; echo after", ["rm", "ls", "pwd", "echo"]),
        ("! grep x f", ["grep"]),
        ("time -p ls", ["ls"]),
        ("exec -a name rm x", ["rm"]),
        ("command -p rm x; builtin echo y", ["rm", "echo"]),
        ("f() { rm -rf x; }; f", ["rm", "f"]),
        ("function g { ls; }", ["ls"]),
        ("", []),
        ("   \n\t", []),
        ("# a comment with an ' in it", []),
    ],
)
def test_lists_pipelines_groups_and_compound_commands_are_split(line: str, expected: list[str]) -> None:
    assert programs(line) == expected


def test_sudo_env_xargs_and_nohup_stay_the_program() -> None:
    assert programs("sudo rm -rf /; env X=1 rm y; xargs rm -f < list; nohup rm z") == [
        "sudo",
        "env",
        "xargs",
        "nohup",
    ]


def test_a_command_of_assignments_or_redirections_alone_has_no_program() -> None:
    assert split_commands("X=1 Y=2") == [ShellCommand("", "X=1 Y=2")]
    assert split_commands("> out") == [ShellCommand("", ">out")]
    assert split_commands("a=(1 2 3)") == [ShellCommand("", "a=(1 2 3)")]


# --- substitutions run commands of their own --------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("echo $(rm -rf x)", [("rm", "rm -rf x"), ("echo", "echo $(rm -rf x)")]),
        ('echo "$(rm -rf x)"', [("rm", "rm -rf x"), ("echo", "echo $(rm -rf x)")]),
        ("echo `rm -rf x; ls`", [("rm", "rm -rf x"), ("ls", "ls"), ("echo", "echo $(rm -rf x; ls)")]),
        ('x=`echo "\\`rm y\\`"`', [("rm", "rm y"), ("echo", "echo $(rm y)"), ("", "x=$(echo $(rm y))")]),
        ("diff <(ls a) >(cat)", [("ls", "ls a"), ("cat", "cat"), ("diff", "diff <(ls a) >(cat)")]),
        ("$(which rm) -rf x", [("which", "which rm"), ("$(which rm)", "$(which rm) -rf x")]),
        ("echo $((1 + $(rm q)))", [("rm", "rm q"), ("echo", "echo $((1 + $(rm q)))")]),
        ("echo $((echo hi) )", [("echo", "echo hi"), ("echo", "echo $((echo hi))")]),
        ("echo ${x:-$(rm -rf y)}", [("rm", "rm -rf y"), ("echo", "echo ${x:-$(rm -rf y)}")]),
    ],
)
def test_substitutions_are_decided_before_the_command_that_uses_them(
    line: str, expected: list[tuple[str, str]]
) -> None:
    assert [(c.program, c.text) for c in split_commands(line)] == expected


def test_single_quotes_and_escapes_keep_substitutions_literal() -> None:
    assert programs("echo '$(rm -rf x)' \\`rm\\` \"\\$(rm y)\"") == ["echo"]


def test_arithmetic_runs_no_command_but_its_substitutions() -> None:
    assert programs("echo $((1+2)) $(( (3) * 4 ))") == ["echo"]


def test_double_parentheses_are_decided_as_sh_reads_them_nested_subshells() -> None:
    # bash evaluates arithmetic (runs nothing); dash runs `rm -rf x` in nested subshells.
    assert programs("((rm -rf x))") == ["rm"]


# --- here-documents ---------------------------------------------------------------------------------------


def test_a_here_document_body_is_data_but_its_substitutions_run() -> None:
    line = "cat <<EOF | grep x\nrm -rf body $(rm -rf sub)\nEOF\nls"
    assert texts(line) == ["cat <<EOF", "rm -rf sub", "grep x", "ls"]


def test_a_quoted_delimiter_keeps_the_body_literal() -> None:
    assert texts("cat <<'EOF'\n$(rm -rf x)\nEOF\nls") == ["cat <<'EOF'", "ls"]


def test_tabs_before_the_delimiter_end_a_dash_here_document() -> None:
    assert programs("cat <<-EOF\n\tbody\n\tEOF\nls") == ["cat", "ls"]


def test_a_body_cannot_hide_the_commands_after_it() -> None:
    # shlex alone reads the quote in the body as opening a string that swallows `rm -rf x`.
    assert programs("cat <<EOF\n'\nEOF\nrm -rf x\necho ''") == ["cat", "rm", "echo"]
    with pytest.raises(ShellSyntaxError, match="a quote is not closed"):
        split_commands("cat <<EOF\n'\nEOF\nrm -rf x\necho '")


# --- what shlex alone gets wrong, each of which would let a command past unseen ---------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("echo a#; rm -rf x", ["echo", "rm"]),  # a `#` inside a word starts no comment
        ("echo ${#x} $# a##b; rm y", ["echo", "rm"]),
        ("ls # comment\nrm -rf y", ["ls", "rm"]),  # the newline after a comment still ends the command
        ("ls \\\n -la", ["ls"]),  # a line continuation
        ("echo \\\\\nrm -rf x", ["echo", "rm"]),  # an escaped backslash before a newline continues nothing
        ("ls\rrm", ["ls\rrm"]),  # a carriage return is no blank
        ("$'rm' -rf x", ["rm"]),  # an ANSI-C string
        ("$'\\x72\\x6d' -rf x", ["rm"]),
        ('$"rm" -rf x', ["rm"]),
        ('echo "$(echo "a)"; rm -rf x; echo "b)")"', ["echo", "rm", "echo", "echo"]),  # quotes nest in $( )
    ],
)
def test_hostile_forms_are_read_as_the_shell_reads_them(line: str, expected: list[str]) -> None:
    assert programs(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("a[$(touch x)]=1", ["touch", ""]),  # bash runs a substitution in an array subscript
        ("x[`id`]+=1 ls", ["id", "ls"]),
        ('a["$(id)"]=$(whoami) cmd $(date)', ["id", "whoami", "date", "cmd"]),
    ],
)
def test_a_substitution_in_an_array_subscript_is_decided_and_the_assignment_read(
    line: str, expected: list[str]
) -> None:
    assert programs(line) == expected
    assert texts("a[$(touch x)]=1") == ["touch x", "a[$(touch x)]=1"]


def test_a_line_the_reader_itself_fails_on_is_a_syntax_error_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> str:
        raise ValueError("zip() argument 2 is shorter than argument 1")

    monkeypatch.setattr("ipybox.rules.shell_commands._render", broken)
    with pytest.raises(ShellSyntaxError, match="shell reader failed on it"):
        split_commands("ls")


def test_quotes_that_only_spell_a_word_are_gone_from_program_and_text() -> None:
    assert split_commands("r\"m\" -r'f' \\x") == [ShellCommand("rm", "rm -rf x")]


def test_text_is_one_normalized_spelling() -> None:
    assert texts("X=1   LD_PRELOAD=x  ls >out 2>&1  'a b' \"$HOME\"") == [
        "X=1 LD_PRELOAD=x ls >out 2>&1 'a b' $HOME"
    ]
    assert texts('A="x y" cmd *.txt') == ["A='x y' cmd *.txt"]
    assert texts("cat <<<'here' 2 >f") == ["cat <<<here 2 >f"]  # `2 >f`: the 2 is an argument


def test_invisible_and_control_characters_are_shown_escaped() -> None:
    assert texts("echo $'a\\nb' $'\\u202e' ''") == ["echo $'a\\nb' $'\\u202e' ''"]


# --- what cannot be read is an error, never a pass --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('ls "unclosed', "a quote is not closed"),
        ("ls 'unclosed", "a quote is not closed"),
        ("ls \\", "the line ends in a backslash"),
        ("echo )", "a ')' closes nothing"),
        ("(ls", "a '(' is not closed"),
        ("echo $(ls", "not closed"),
        ("echo `ls", "a backtick substitution is not closed"),
        ("ls >", "the redirection '>' has no target"),
        ("ls > ;", "the redirection '>' has no target before ';'"),
        ("cat <<EOF\nno end", "a here-document has no line 'EOF' to end it"),
        ("((x<<2))\nrm -rf y\n2", "a here-document inside (( ))"),
        ("echo $'it\\'s'", "read differently by bash and sh"),
        ("echo $'unclosed", "a $'...' string is not closed"),
        ("coproc x { rm y; }", "coproc is not supported"),
        ("case x in a) ls;;", "a case statement is not closed"),
        ("echo $((1 # 2))\nrm y\n)", "not closed"),
        ("x\ue000", "U+E000"),
    ],
)
def test_a_line_that_cannot_be_read_raises_naming_the_problem(line: str, message: str) -> None:
    with pytest.raises(ShellSyntaxError, match=re.escape(message)):
        split_commands(line)


def test_nesting_deeper_than_the_limit_is_refused() -> None:
    line = "$(" * (MAX_NESTING + 1) + "ls" + ")" * (MAX_NESTING + 1)
    with pytest.raises(ShellSyntaxError, match="nested deeper"):
        split_commands(line)
    assert programs("$(" * (MAX_NESTING - 1) + "ls" + ")" * (MAX_NESTING - 1))[0] == "ls"


def test_substitutions_that_would_be_read_again_and_again_are_refused_as_too_costly() -> None:
    # Each `$((` that turns out not to be arithmetic is read twice: nested, that doubles per level.
    line = "$((" * 30 + "a) )" * 30
    with pytest.raises(ShellSyntaxError, match=r"too costly|nested deeper"):
        split_commands(line)


# --- shell_calls: the kernel's question, as the rules see it ---------------------------------------------


def test_a_shell_question_becomes_one_shell_call_per_command_keeping_the_caller() -> None:
    question = ToolCall("ipybox", "shell", {"cmd": "ls && rm -rf d"}, caller="k1")
    assert is_shell_question(question)
    assert shell_calls(question) == [
        ToolCall(SHELL_SERVER, "ls", {"cmd": "ls"}, caller="k1"),
        ToolCall(SHELL_SERVER, "rm", {"cmd": "rm -rf d"}, caller="k1"),
    ]
    assert not is_shell_question(ToolCall("fs", "shell"))


@pytest.mark.parametrize("magic", [None, "script bash", "script --bg --out var sh", "script /bin/bash"])
def test_bash_and_sh_cells_are_scripts_and_split(magic: str | None) -> None:
    args = {"cmd": "ls\nrm -rf d\n"} | ({"magic": magic} if magic else {})
    assert [call.tool for call in shell_calls(ToolCall("ipybox", "shell_magic", args))] == ["ls", "rm"]


@pytest.mark.parametrize(
    ("magic", "program"),
    [
        ("perl", "perl"),
        ("python3 -u", "python3"),
        ("script --proc p ruby", "ruby"),
        ("script bash -x", "bash"),
    ],
)
def test_another_interpreters_cell_is_one_command_of_that_interpreter(magic: str, program: str) -> None:
    question = ToolCall("ipybox", "shell_magic", {"cmd": "print 1;\n", "magic": magic}, caller="k")
    assert shell_calls(question) == [
        ToolCall(SHELL_SERVER, program, {"cmd": "print 1;\n", "magic": magic}, caller="k")
    ]


@pytest.mark.parametrize(
    "args", [{}, {"cmd": 1}, {"cmd": "ls", "magic": 2}, {"cmd": "x", "magic": ""}, {"cmd": "x", "magic": "'"}]
)
def test_a_malformed_question_raises(args: dict[str, object]) -> None:
    with pytest.raises(ShellSyntaxError):
        shell_calls(ToolCall("ipybox", "shell_magic", args))


# --- properties -------------------------------------------------------------------------------------------

SHELLISH = st.text(alphabet="abc xy12\t\n;&|<>()$`'\"\\#={}*!-", max_size=60)


@settings(max_examples=400, deadline=None)
@given(SHELLISH)
def test_any_text_is_read_or_refused_with_a_shell_syntax_error(line: str) -> None:
    try:
        commands = split_commands(line)
    except ShellSyntaxError:
        return
    assert all(isinstance(c.program, str) and isinstance(c.text, str) for c in commands)


# The oracles: real shells run a line with only stub programs on PATH, each logging its name.
STUBS = ["a", "b", "c", "ab", "ba", "cc"]
SHELLS = [shell for shell in ("bash", "dash") if shutil.which(shell)]


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("stubs")
    for name in STUBS:
        stub = directory / name
        stub.write_text('#!/bin/sh\necho "${0##*/}" >> "$STUB_LOG"\n')
        stub.chmod(0o755)
    return directory


_runs = iter(range(1 << 62))


def ran(shell: str, line: str, stub_dir: Path) -> set[str]:
    """The stub programs `shell -c line` ran."""
    work = stub_dir.parent / f"run-{next(_runs)}"
    work.mkdir()
    log = work / "log"
    env = {"PATH": str(stub_dir), "STUB_LOG": str(log), "HOME": str(work), "LC_ALL": "C"}
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            [shutil.which(shell) or shell, "-c", line],
            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=10, start_new_session=True, check=False,
        )  # fmt: skip
    names = set(log.read_text().split()) if log.exists() else set()
    shutil.rmtree(work, ignore_errors=True)
    return names


def assert_decided(line: str, stub_dir: Path) -> None:
    """Every program a shell runs for `line` was decided, unless the split refused the line or decided a
    program computed at run time (whose name it cannot know)."""
    try:
        decided = {command.program for command in split_commands(line)}
    except ShellSyntaxError:
        return
    if any(char in program for program in decided for char in "$`*?[{~"):
        return
    for shell in SHELLS:
        assert ran(shell, line, stub_dir) <= decided, f"{shell} ran more than was decided for {line!r}"


NAMES = st.sampled_from(STUBS)
ARGS = st.sampled_from(["x", "-rf", "'y z'", '"q"', "a#b", "\\;", "$'\\n'", "2>/dev/null", ">out", "''"])


def spelled(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, f'"{name}"', f"'{name}'", f"\\{name}", f"{name}''", f"$'{name}'"])


@st.composite
def command_line(draw: st.DrawFn, depth: int = 0) -> str:
    """A line of simple commands, substitutions, groups and compound commands over the stub programs."""

    def simple() -> str:
        words = [draw(NAMES.flatmap(spelled))]
        for _ in range(draw(st.integers(0, 3))):
            if depth < 2 and draw(st.integers(0, 5)) == 0:
                inner = draw(command_line(depth + 1))
                words.append(draw(st.sampled_from([f"$({inner})", f'"$({inner})"', f"x$({inner})y"])))
            else:
                words.append(draw(ARGS))
        return " ".join(words)

    def unit() -> str:
        kind = draw(st.integers(0, 9 if depth < 2 else 2))
        if kind <= 3:
            return simple()
        inner = draw(command_line(depth + 1))
        return [
            f"{{ {inner}; }}",
            f"({inner})",
            f"if {simple()}; then {inner}; else {simple()}; fi",
            f"for v in x y; do {inner}; done",
            f"case x in x|y) {inner};; *) {simple()};; esac",
            f"{simple()} <<EOF{depth}\nbody ' \" $({inner})\nEOF{depth}\n",
        ][kind - 4]

    parts = [unit()]
    for _ in range(draw(st.integers(0, 3))):
        parts.append(draw(st.sampled_from([";", "&&", "||", "|", "\n", " # comment ' \n", " \\\n;"])))
        parts.append(unit())
    return " ".join(parts)


@pytest.mark.skipif(not SHELLS, reason="needs bash or dash")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_line())
def test_every_program_bash_and_dash_run_for_a_generated_line_was_decided(stub_dir: Path, line: str) -> None:
    split_commands(line)  # lines of the grammar are all read, none refused
    assert_decided(line, stub_dir)


@pytest.mark.skipif(not SHELLS, reason="needs bash or dash")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet="abc 12\t\n;&|<>$`'\"\\#=", max_size=40))
def test_every_program_bash_and_dash_run_for_random_text_was_decided(stub_dir: Path, line: str) -> None:
    # No parentheses or braces: random text could otherwise define a function that forks itself.
    assert_decided(line, stub_dir)
