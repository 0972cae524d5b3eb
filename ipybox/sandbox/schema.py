"""The JSON Schema of sandbox policy files, shipped in the package as `ipybox/data/schemas/` (regenerate:
`python -m ipybox.sandbox.schema`; `ipybox schema --sandbox-policy` prints where it is installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ipybox.sandbox.policy import SandboxPolicy

SCHEMA_FILE = "sandbox-policy.schema.json"


def policy_schema() -> dict[str, Any]:
    schema = SandboxPolicy.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ipybox sandbox policy"
    return schema


def render() -> str:
    return json.dumps(policy_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    # The package's data directory (ipybox.config.schema.packaged_file, a layer above, finds it too).
    target = Path(__file__).resolve().parents[1] / "data" / "schemas" / SCHEMA_FILE
    target.write_text(render())
    print(f"wrote {target}")
