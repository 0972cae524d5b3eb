"""Saved code actions by category, written by ipybox. Do not edit: save_code_action rewrites this
index.

Each category's __init__.py lists its actions with one line each. Usage:

    from gentools.<category>.<action> import Params, run

Categories (category: actions):

- files: python_overview
"""

__all__ = [
    "files",
]
