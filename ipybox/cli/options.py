"""How every `ipybox` command names its workspace, and how a usage error is shown.

Contract:

- A command that acts on a workspace takes it as `-w DIR` / `--workspace DIR` (`add_workspace_option`),
  the current directory when not given; `workspace_of` reads it. The top-level parser's `--workspace`
  (`ipybox --workspace DIR status`, and ipybox 0.9's `ipybox --workspace DIR`, which is `ipybox mcp`) is
  taken too when the command's own is not given.
- The positional `DIR` some commands took before `-w` existed (`ipybox up DIR`, `ipybox policy check DIR
  CALL`, ...) keeps working for the scripts and documents that use it (`legacy_positional=True`), hidden
  from help and usage. Given both ways, it must be the same directory, or it is a usage error.
- A usage error (`usage_error`, and argparse's own: an unknown option, a missing argument) is shown with
  the usage of the command that was given, not the whole top-level help, and one line saying what was
  wrong (`CommandParser`); exit status 2, as argparse's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

WORKSPACE_DEST = "workspace"
"""Where `-w/--workspace` is stored (`None` when not given)."""
LEGACY_DEST = "legacy_dir"
"""Where the hidden positional `DIR` is stored (`None` when not given)."""
TOP_LEVEL_DEST = "mcp_workspace"
"""Where the top-level parser's `--workspace` is stored (`ipybox --workspace DIR [COMMAND]`)."""
_PARSER_DEST = "command_parser"


class CommandParser(argparse.ArgumentParser):
    """An `ipybox` parser whose sub-commands report their own usage errors.

    argparse leaves an unknown argument of a sub-command to the top-level parser, which prints its own
    usage (every command's options but none of the sub-command's): here the sub-command's parser reports
    it, with its usage."""

    top_level = False

    def parse_known_args(  # type: ignore[override]
        self, args: list[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self.top_level:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def finish(parser: argparse.ArgumentParser) -> None:
    """Mark `parser` (a `CommandParser`) as the top-level one and let each (sub-)command's parser be found
    from the parsed arguments (`usage_error`), once every sub-command is added."""
    if isinstance(parser, CommandParser):
        parser.top_level = True
    parser.set_defaults(**{_PARSER_DEST: parser})
    _remember_parsers(parser)


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                # The innermost command's default wins: its namespace is copied over its parent's.
                sub.set_defaults(**{_PARSER_DEST: sub})
                _remember_parsers(sub)


def command_parser(args: argparse.Namespace, fallback: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser of the command that was given (`fallback` when `finish` did not run on its tree)."""
    found = getattr(args, _PARSER_DEST, None)
    return found if isinstance(found, argparse.ArgumentParser) else fallback


def usage_error(args: argparse.Namespace, message: str, fallback: argparse.ArgumentParser) -> NoReturn:
    """Show the given command's usage and `message`, and exit 2."""
    command_parser(args, fallback).error(message)


def add_workspace_option(
    parser: argparse.ArgumentParser,
    *,
    legacy_positional: bool = False,
    help_text: str = "the workspace directory (default: .)",
    **kwargs: Any,
) -> None:
    """Add `-w DIR` / `--workspace DIR` to `parser` (stored under `WORKSPACE_DEST`, `None` when not
    given; read it with `workspace_of`).

    Args:
        legacy_positional: Also take the workspace as an optional positional `DIR`, hidden from help: the
            form this command had before `-w` (add it where that positional was: before any other).
        help_text: The option's help text.
        kwargs: More `add_argument` keywords for the option.
    """
    parser.add_argument(
        "-w",
        "--workspace",
        dest=WORKSPACE_DEST,
        type=Path,
        default=None,
        metavar="DIR",
        help=help_text,
        **kwargs,
    )
    if legacy_positional:
        parser.add_argument(LEGACY_DEST, nargs="?", type=Path, default=None, help=argparse.SUPPRESS)


def workspace_given(args: argparse.Namespace, fallback: argparse.ArgumentParser) -> Path | None:
    """The workspace as given (`-w`, the legacy positional or the top-level `--workspace`), `None` when it
    was not; a usage error when it was given twice, differently."""
    given = {
        option: value
        for option, value in (
            ("-w", getattr(args, WORKSPACE_DEST, None)),
            ("DIR", getattr(args, LEGACY_DEST, None)),
            ("ipybox --workspace", getattr(args, TOP_LEVEL_DEST, None)),
        )
        if isinstance(value, Path)
    }
    if len({value.resolve() for value in given.values()}) > 1:
        both = " and ".join(f"{option} {value}" for option, value in given.items())
        usage_error(args, f"the workspace is given twice ({both}): give it once, with -w DIR", fallback)
    return next(iter(given.values()), None)


def workspace_of(args: argparse.Namespace, fallback: argparse.ArgumentParser) -> Path:
    """The workspace given (see `workspace_given`), else the current directory (`.`)."""
    given = workspace_given(args, fallback)
    return given if given is not None else Path(".")
