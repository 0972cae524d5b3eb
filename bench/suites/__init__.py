"""Suites: each module here builds a `bench.registry.Suite` and registers it on import.

To add a suite, drop a module in this package; `load_all()` imports every module it finds.
"""

import importlib
import pkgutil


def load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
