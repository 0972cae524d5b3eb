"""A code action both remote suites save and reuse: `gentools.loud.shout`, which calls the edge server."""

API = '''"""Shout a text."""

from pydantic import BaseModel


class Params(BaseModel):
    text: str


def run(params: Params) -> str:
    """Return `text` in capitals, through the edge server's echo."""
    from gentools.loud.shout.impl import shout

    return shout(params.text)
'''

IMPL = """from mcptools.edge import echo


def shout(text: str) -> str:
    return echo.run(echo.Params(text=text)).upper()
"""
