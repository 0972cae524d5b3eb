"""Saved code actions of category 'files', written by ipybox. Do not edit: save_code_action
rewrites this index.

Each action is a package: read its api.py for the interface (`Params`, the result model and
`run()`'s docstring). Usage:

    from gentools.files.<action> import Params, run

Actions (name: description):

- python_overview: List a directory's subdirectories and its Python files, each with its first line (a comment or docstring says what it...
"""

__all__ = [
    "python_overview",
]
