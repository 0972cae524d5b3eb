"""Saved code action files.python_overview: the Python files of a directory, each with its first line."""

from pydantic import BaseModel


class Params(BaseModel):
    path: str = "."
    """Directory to look in, relative to the workspace."""


class PythonFile(BaseModel):
    name: str
    first_line: str


class Overview(BaseModel):
    directories: list[str]
    python_files: list[PythonFile]


def run(params: Params) -> Overview:
    """List a directory's subdirectories and its Python files, each with its first line (a comment or
    docstring says what it is). Reads only: two read-only filesystem tools."""
    from .impl import overview

    return overview(params.path)
