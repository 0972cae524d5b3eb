"""The one base of every message on ipybox's approval websockets: the application's (`ipybox.approval.wire`,
JSON-RPC 2.0) and the approvers' (`ipybox.approval.ask_events`: the web console's events, `ipybox approve`,
the questions of `/asks`).

Contracts, the same for both protocols: a message is one text frame of JSON; fields a receiver does not
know are ignored (either end may add some) and the types of known ones are strict where a model says so;
messages are immutable; and every message can be sent, whatever a kernel put into it: a string with no
UTF-8 form (a lone surrogate, from a kernel's `"\\ud800"`) goes out as the text `\\ud800`, which is how
receivers show it anyway, so one hostile argument can't cut a connection.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticSerializationError

__all__ = ["WireMessage"]


class WireMessage(BaseModel):
    """A message of an approval websocket (see the module's contracts)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    def to_json(self) -> str:
        """The message as one text frame."""
        try:
            return self.model_dump_json()
        except PydanticSerializationError:
            return json.dumps(_surrogates_as_text(self.model_dump(mode="json")), separators=(",", ":"))


def _surrogates_as_text(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_surrogates_as_text(key): _surrogates_as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_surrogates_as_text(item) for item in value]
    return value
