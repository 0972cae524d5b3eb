"""Checking agent-written modules in a fresh kernel: the host sends code that calls `main()`, and reads
the one line it prints (`MARKER` + JSON). See `ipybox.codeact.checks` for the host's side.

`main()` imports each module; for a module that fails it reports where: a `SyntaxError`'s own position,
else the innermost traceback frame in a file under `root` (the workspace), else the innermost frame.
Staged packages (a saved action before it is accepted) are imported under their final name from the
directory they were written to, without being on the import path. In a kernel that does not share the
host's files (the directory does not exist here, and `ipybox.in_kernel.remote` installed its import
hook), the hook serves them from the host's directory (`remote_modules.RemoteModules.stage`): `__file__`
and tracebacks show the host's paths, so problems are located as in a local kernel. With `describe`, it
also reports what an action's `api.py` offers (`run()`'s docstring and signature, the JSON Schemas of
`Params` and of the result model), for its MCP tool.

The report is advice about code the kernel ran, not a security boundary: code that can run at import time
can also print a report of its own. The host validates it as untrusted data.

Standard library only (pydantic models are used by duck typing: `model_json_schema`).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import re
import sys
import traceback
import typing
from collections.abc import Mapping, Sequence
from typing import Any

MARKER = "ipybox-import-check:"
"""Prefix of the report line."""


def main(
    modules: Sequence[str],
    staged: Mapping[str, str] | None = None,
    describe: str | None = None,
    root: str | None = None,
) -> None:
    """Import `modules` and print the report line.

    Args:
        modules: Dotted names, imported in order.
        staged: Package name -> directory holding its `__init__.py`, registered before importing.
        describe: An action package (`gentools.<category>.<name>`) whose `api` module to describe.
        root: The workspace directory: traceback frames in files under it locate a problem.
    """
    problems: list[dict[str, Any]] = []
    # A problem in a staged package is located in its own files first: a tool call it makes at import
    # fails in a generated module under `root` too, but the line to fix is the package's.
    within = list((staged or {}).values())
    for name, directory in (staged or {}).items():
        try:
            _register(name, directory)
        except BaseException as e:
            problems.append(_problem(name, e, root, within))
    if not problems:
        for module in modules:
            try:
                importlib.import_module(module)
            except BaseException as e:
                problems.append(_problem(module, e, root, within))
    action: dict[str, Any] | None = None
    if describe is not None and not problems:
        try:
            action, layout = _describe(describe)
            problems += layout
        except BaseException as e:
            problems.append(_problem(f"{describe}.api", e, root, within))
    # On a line of its own: module code may have printed without a newline at the end.
    print("\n" + MARKER + json.dumps({"problems": problems, "action": action}, default=str))


def _register(name: str, directory: str) -> None:
    init = os.path.join(directory, "__init__.py")
    spec = _remote_spec(name, directory)
    if spec is None:
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[directory])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {init}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def _remote_spec(name: str, directory: str) -> importlib.machinery.ModuleSpec | None:
    """The staged package's spec from the tool server, when the directory is the host's only."""
    if os.path.isdir(directory):
        return None
    from ipybox.in_kernel import remote_modules  # only here: a local kernel's check never needs it

    hook = remote_modules.installed()
    if hook is None or not hook.serves(name):
        return None
    spec = hook.stage(name, directory)
    if spec is None:
        raise ImportError(f"cannot load {os.path.join(directory, '__init__.py')}: not on the host", name=name)
    return spec


def _problem(
    module: str, error: BaseException, root: str | None, within: Sequence[str] = ()
) -> dict[str, Any]:
    message = f"{type(error).__name__}: {error}"
    if isinstance(error, SyntaxError):
        return {
            "module": module,
            "path": error.filename,
            "line": error.lineno,
            "column": error.offset,
            "message": f"{type(error).__name__}: {error.msg}",
        }
    extracted = list(traceback.extract_tb(error.__traceback__))
    frames = [f for f in extracted if not f.filename.startswith("<frozen ")] or extracted
    chosen = None
    for directory in [*within, *([root] if root is not None else [])]:
        prefix = os.path.join(os.path.realpath(directory), "")
        inside = [f for f in frames if os.path.realpath(f.filename).startswith(prefix)]
        if inside:
            chosen = inside[-1]
            break
    if chosen is None and frames:
        chosen = frames[-1]
    column = getattr(chosen, "colno", None)
    return {
        "module": module,
        "path": chosen.filename if chosen is not None else None,
        "line": chosen.lineno if chosen is not None else None,
        "column": column + 1 if isinstance(column, int) else None,
        "message": message,
    }


def _describe(package: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the action's api offers, and what in it does not match the layout."""
    api = sys.modules.get(f"{package}.api") or importlib.import_module(f"{package}.api")
    path = getattr(api, "__file__", None)
    problems: list[dict[str, Any]] = []

    def problem(message: str, obj: object = None) -> None:
        line = None
        if obj is not None:
            try:
                line = inspect.getsourcelines(obj)[1]  # type: ignore[arg-type]
            except (OSError, TypeError):
                line = None
        problems.append(
            {"module": f"{package}.api", "path": path, "line": line, "column": None, "message": message}
        )

    run = getattr(api, "run", None)
    params = getattr(api, "Params", None)
    if not callable(run):
        problem("api.py must define a function run()")
        return {}, problems
    if params is not None and not (inspect.isclass(params) and hasattr(params, "model_json_schema")):
        problem("Params in api.py must be a pydantic model (class Params(BaseModel))", params)
    try:
        signature = inspect.signature(run)
    except (TypeError, ValueError):
        signature = None
    required = [
        p
        for p in (signature.parameters.values() if signature is not None else [])
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if params is not None and len(required) != 1:
        problem("run() must take one argument, params: Params (api.py defines Params)", run)
    if params is None and required:
        problem("run() takes arguments, so api.py must define them as a pydantic model Params", run)
    if not inspect.getdoc(run):
        problem("run() needs a docstring: it is what agents read (and the MCP tool's description)", run)
    output_schema = None
    returns = None
    try:
        hints = typing.get_type_hints(run)
    except Exception:
        hints = {}
    result = hints.get("return", signature.return_annotation if signature is not None else None)
    if result is not None and result is not inspect.Signature.empty:
        returns = getattr(result, "__name__", None) or str(result)
        if inspect.isclass(result) and hasattr(result, "model_json_schema"):
            try:
                output_schema = result.model_json_schema()
            except Exception as e:
                problem(f"the result model {returns} has no JSON Schema: {e}", result)
    input_schema: dict[str, Any] = {"type": "object", "properties": {}}
    if params is not None and hasattr(params, "model_json_schema"):
        try:
            input_schema = params.model_json_schema()
        except Exception as e:
            problem(f"Params has no JSON Schema: {e}", params)
    action = {
        "doc": inspect.getdoc(run) or "",
        "signature": f"run{_signature_text(signature)}" if signature is not None else "run(...)",
        "takes_params": params is not None,
        "is_async": inspect.iscoroutinefunction(run),
        "returns": returns,
        "input_schema": input_schema,
        "output_schema": output_schema,
    }
    return action, problems


class _Text:
    """An annotation shown as written (`inspect` quotes strings and prefixes classes with their module)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# `gentools.cat.name.api.Params` -> `Params`, `typing.Optional` -> `Optional`: an agent reads the
# signature next to the action's api.py, where the names are bare.
_MODULE_PREFIX = re.compile(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+(?=[A-Za-z_])")


def _annotation_text(annotation: object) -> object:
    if annotation is inspect.Parameter.empty:
        return annotation
    if isinstance(annotation, str):
        text = annotation
    elif inspect.isclass(annotation) and not getattr(annotation, "__args__", None):
        text = annotation.__qualname__
    else:
        text = inspect.formatannotation(annotation)
    return _Text(_MODULE_PREFIX.sub("", text))


def _signature_text(signature: inspect.Signature) -> str:
    """`(params: Params) -> Result`: annotations as an agent reads them in api.py."""
    parameters = [p.replace(annotation=_annotation_text(p.annotation)) for p in signature.parameters.values()]
    returns = _annotation_text(signature.return_annotation)
    return str(signature.replace(parameters=parameters, return_annotation=returns))
