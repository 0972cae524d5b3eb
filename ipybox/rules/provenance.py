"""Provenance of tool-call arguments: which earlier results of the same session a value came from.

The tool server (on the host, outside the sandbox) records every tool result it delivers to a session
(`ProvenanceTracker.record`) with its origin (server, tool, the result's serial number in the session, time)
and a trust label (`ProvenanceSettings.label_for`), and matches every argument of the session's later calls
against what it recorded (`ProvenanceTracker.match`); the matches travel with the call as
`ToolCall.provenance`, and the labels the session has read as `ToolCall.session_read`. Rules condition on
both (`when = { session_read = "untrusted" }`, `when = { argument_from = "untrusted" }`,
`args = { to = { from = "untrusted" } }`).

Two parts, with different strength:

- Session taint (`session_read`) is a proof: the host saw the bytes go to the session, and nothing the kernel
  sends can clear it (a kernel's `reset` does not; only `forget`, when the session ends, does).
- Value matching (`provenance`) is a signal, not a proof: code in the kernel can transform a value (encode,
  split, translate, re-case beyond what normalisation undoes) until it no longer matches. It catches the
  copy-paste an injected instruction usually produces, and names where a value came from for the person
  approving; rules that must hold against hostile code condition on `session_read`.

Matching, for each string leaf of the arguments (numbers count as their decimal text), after normalisation
(Unicode case folding, every run of whitespace one space, trimmed):

- exact: the value equals a whole recorded leaf, or an identifier-like token of one (a word with `@`, `.`,
  `/`, `:`, `_`, `-`, `#` or a digit: e-mail addresses, URLs, ids), of at least `min_exact` characters;
- substring: a value of at least `min_length` characters shares a run of at least `min_length` characters
  with a recorded result. Results are indexed by hashes of their non-overlapping blocks of
  `min_length // 2` characters (any common run of `min_length` contains a whole block), each hit verified
  against the text; so recording costs one hash per block and matching one per character of the argument
  (the first `MAX_SCAN` characters of each value).

Memory per session is bounded by `max_bytes` (approximate bytes held: the normalised text plus the index
entries, `ENTRY_BYTES` each, an estimate measured with `tracemalloc` by `bench/suites/provenance.py`).
Past it the oldest results are evicted first (their values no longer match; the session's taint stays). A
result larger than a quarter of the cap is indexed by its first quarter.

Pure and process-free: the tool server calls it on its event loop; a call's match costs microseconds at
10,000 recorded results (see the bench).
"""

from __future__ import annotations

import fnmatch
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ipybox.rules.calls import Label, Origin
from ipybox.rules.tool_annotations import annotation_value

__all__ = [
    "ENTRY_BYTES",
    "MAX_ORIGINS",
    "MAX_SCAN",
    "ProvenanceSettings",
    "ProvenanceSource",
    "ProvenanceTracker",
    "normalise",
]

ENTRY_BYTES: Final = 96
"""Bytes an index entry is counted as (a dict slot, its key object and the key's place in the result's list
of keys; measured 80-100 with tracemalloc)."""

MAX_SCAN: Final = 16384
"""Characters of each argument value that are matched (the rest is not looked at)."""

MAX_ORIGINS: Final = 3
"""Origins kept per argument value (newest first)."""

_MAX_EXACT: Final = 512
"""Whole leaves longer than this are matched by substring only."""

_MAX_VERIFY: Final = 16
"""Block hits verified per argument value: common short runs in prose cannot make matching slow."""

_ID_CHARS: Final = frozenset("@./:_-#0123456789")
_PUNCTUATION: Final = "\"'`.,;:!?()[]{}<>*"


def normalise(text: str) -> str:
    """Text as matching compares it: case-folded, every run of whitespace one space, trimmed."""
    return " ".join(text.casefold().split())


class ProvenanceSource(BaseModel):
    """One `[[provenance.sources]]` entry: the label of results from the tools it names.

    Attributes:
        server: fnmatch glob on the server name, or a list of globs.
        tool: fnmatch glob on the tool name, or a list of globs.
        label: `untrusted`, `private` or `trusted`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str | list[str] = "*"
    tool: str | list[str] = "*"
    label: Label

    @field_validator("server", "tool")
    @classmethod
    def _globs_given(cls, value: str | list[str]) -> str | list[str]:
        if value == []:
            raise ValueError("an empty list of globs matches nothing; use '*' to match any name")
        return value

    def applies(self, server: str, tool: str) -> bool:
        """Whether this entry names `server`'s `tool`."""
        servers = [self.server] if isinstance(self.server, str) else self.server
        tools = [self.tool] if isinstance(self.tool, str) else self.tool
        return any(fnmatch.fnmatchcase(server, s) for s in servers) and any(
            fnmatch.fnmatchcase(tool, t) for t in tools
        )


class ProvenanceSettings(BaseModel):
    """The `[provenance]` table of `ipybox.toml`: how tool results are labelled and matched.

    ```toml
    [provenance]
    undeclared = "untrusted"   # tools that declare no openWorldHint
    min_length = 24            # substring matches of at least this many characters
    max_bytes = 8388608        # memory held per session; the oldest results are evicted past it

    [[provenance.sources]]
    server = "mail"
    tool = ["read_*", "search_*"]
    label = "private"
    ```

    A result's label is that of the first `sources` entry naming its tool (file order); else, by the
    tool's `openWorldHint`: `true` (it reaches the open world: the web, others' messages) is `untrusted`,
    `false` is `trusted`; a tool that declares none gets `undeclared` (MCP's default for an undeclared
    `openWorldHint` is `true`, so `untrusted` by default too).

    Attributes:
        sources: Labels of named tools, first match wins.
        undeclared: The label of results from tools that declare no `openWorldHint` and no entry names.
        min_length: The shortest run of characters an argument shares with a result for a substring
            match (at least 8).
        min_exact: The shortest value matched exactly (whole leaf or identifier-like token, at least 3).
        max_bytes: Approximate memory held per session for matching (at least 65536); past it the oldest
            results are evicted.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[ProvenanceSource] = Field(default_factory=list)
    undeclared: Label = "untrusted"
    min_length: int = Field(default=24, ge=8, le=4096)
    min_exact: int = Field(default=4, ge=3, le=512)
    max_bytes: int = Field(default=8 * 1024 * 1024, ge=65536)

    @model_validator(mode="after")
    def _exact_below_substring(self) -> ProvenanceSettings:
        if self.min_exact > self.min_length:
            raise ValueError(
                f"min_exact ({self.min_exact}) must not exceed min_length ({self.min_length}): values in "
                "between would match neither way"
            )
        return self

    def label_for(self, server: str, tool: str, annotations: Mapping[str, Any]) -> Label:
        """The label of a result of `server`'s `tool` whose MCP annotations are `annotations`."""
        for source in self.sources:
            if source.applies(server, tool):
                return source.label
        declared = annotations.get("openWorldHint")
        if not isinstance(declared, bool):
            return self.undeclared
        return "untrusted" if annotation_value(annotations, "openWorldHint") else "trusted"


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """The string leaves of a JSON value (numbers as their text, booleans and null left out), with their
    dotted paths (list items by index: `recipients.0`)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        yield path, str(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}.{index}" if path else str(index))


@dataclass(slots=True)
class _Result:
    origin: Origin
    text: str
    exact: list[str]
    blocks: list[int]
    size: int


@dataclass(slots=True)
class _Session:
    results: deque[_Result] = field(default_factory=deque)
    by_serial: dict[int, _Result] = field(default_factory=dict)
    exact: dict[str, int] = field(default_factory=dict)
    blocks: dict[int, int] = field(default_factory=dict)
    read: dict[str, Origin] = field(default_factory=dict)
    serial: int = 0
    size: int = 0


class ProvenanceTracker:
    """What each session was delivered, and where its calls' arguments came from.

    Sessions are named by the caller (`ToolCall.caller`: the kernel's token name; `""` for the shared
    token). Not thread-safe: one event loop calls it.

    Args:
        settings: Labels, thresholds and the memory cap (default: `ProvenanceSettings()`).
    """

    def __init__(self, settings: ProvenanceSettings | None = None) -> None:
        self.settings = settings or ProvenanceSettings()
        self._sessions: dict[str, _Session] = {}

    def configure(self, settings: ProvenanceSettings) -> None:
        """Label and match by `settings` from now on. Recorded results keep their label; a lower
        `max_bytes` evicts at the next record; a changed `min_length` or `min_exact` drops the recorded
        values (they were indexed for the old ones), never the sessions' taint."""
        old, self.settings = self.settings, settings
        if (old.min_length, old.min_exact) != (settings.min_length, settings.min_exact):
            for session in self._sessions:
                self.retire(session)

    def record(
        self,
        session: str,
        server: str,
        tool: str,
        value: Any,
        annotations: Mapping[str, Any],
        *,
        now: float | None = None,
    ) -> Origin:
        """Record a result delivered to `session` (its string leaves), label it, and taint the session with
        its label. Returns its origin."""
        settings = self.settings
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session()
        state.serial += 1
        label = settings.label_for(server, tool, annotations)
        origin = Origin(server, tool, state.serial, label, time.time() if now is None else now)
        state.read.setdefault(label, origin)
        # A quarter of the cap in bytes as `size` below counts them: the text and a block per `width` chars.
        width = settings.min_length // 2
        budget = settings.max_bytes // 4
        per_char = 1 + ENTRY_BYTES / width
        parts: list[str] = []
        exact: dict[str, None] = {}
        used = 64.0
        for _, leaf in leaves(value):
            room = int((budget - used) * 3 / 4 / per_char)  # a quarter left for its exact entries
            if room <= 0:
                break
            text = normalise(leaf[:room])[:room]
            used += (len(text) + 1) * per_char
            parts.append(text)
            candidates = [text] if settings.min_exact <= len(text) <= _MAX_EXACT else []
            candidates += [
                token
                for token in (word.strip(_PUNCTUATION) for word in text.split(" "))
                if len(token) >= settings.min_exact and not _ID_CHARS.isdisjoint(token)
            ]
            for key in candidates:
                if key not in exact:
                    if used + ENTRY_BYTES > budget:
                        break
                    exact[key] = None
                    used += ENTRY_BYTES
        joined = "\x00".join(parts)
        blocks = [hash(joined[i : i + width]) for i in range(0, len(joined) - width + 1, width)]
        serial = state.serial
        for key in exact:
            state.exact[key] = serial
        for block in blocks:
            state.blocks[block] = serial
        size = len(joined) + 64 + ENTRY_BYTES * (len(exact) + len(blocks))
        result = _Result(origin, joined, list(exact), blocks, size)
        state.results.append(result)
        state.by_serial[serial] = result
        state.size += size
        while state.size > settings.max_bytes and len(state.results) > 1:
            self._evict(state)
        return origin

    @staticmethod
    def _evict(state: _Session) -> None:
        old = state.results.popleft()
        serial = old.origin.serial
        del state.by_serial[serial]
        state.size -= old.size
        for key in old.exact:
            if state.exact.get(key) == serial:
                del state.exact[key]
        for block in old.blocks:
            if state.blocks.get(block) == serial:
                del state.blocks[block]

    def match(self, session: str, args: Mapping[str, Any]) -> dict[str, tuple[Origin, ...]]:
        """The recorded results of `session` each argument value matched, by argument path (only paths
        that matched)."""
        state = self._sessions.get(session)
        if state is None or not state.results:
            return {}
        settings = self.settings
        found: dict[str, tuple[Origin, ...]] = {}
        for path, leaf in leaves(args):
            text = normalise(leaf[:MAX_SCAN])
            if len(text) < settings.min_exact:
                continue
            serials: list[int] = []
            serial = state.exact.get(text)
            if serial is None and " " not in text:
                serial = state.exact.get(text.strip(_PUNCTUATION))
            if serial is not None:
                serials.append(serial)
            if len(text) >= settings.min_length:
                serials.extend(self._substring(state, text, serials))
            if serials:
                found[path] = tuple(
                    state.by_serial[s].origin for s in sorted(set(serials), reverse=True)[:MAX_ORIGINS]
                )
        return found

    def _substring(self, state: _Session, text: str, already: list[int]) -> list[int]:
        """Results sharing a run of at least `min_length` characters with `text`."""
        minimum = self.settings.min_length
        width = minimum // 2
        blocks = state.blocks
        done = set(already)
        found: list[int] = []
        verified = 0
        for i in range(len(text) - width + 1):
            serial = blocks.get(hash(text[i : i + width]))
            if serial is None or serial in done:
                continue
            verified += 1
            if _shares_run(text, i, width, state.by_serial[serial].text, minimum):
                done.add(serial)
                found.append(serial)
                if len(found) >= MAX_ORIGINS:
                    break
            if verified >= _MAX_VERIFY:
                break
        return found

    def session_read(self, session: str) -> tuple[Origin, ...]:
        """One origin per label `session` has been delivered (the first result with it), oldest first."""
        state = self._sessions.get(session)
        if state is None:
            return ()
        return tuple(sorted(state.read.values(), key=lambda origin: origin.serial))

    def results(self, session: str) -> int:
        """How many results of `session` are held for matching."""
        state = self._sessions.get(session)
        return 0 if state is None else len(state.results)

    def memory(self, session: str) -> int:
        """The approximate bytes held for `session` (what `max_bytes` caps)."""
        state = self._sessions.get(session)
        return 0 if state is None else state.size

    def retire(self, session: str) -> None:
        """Drop the results held for `session`, whose kernel is gone, and keep its taint (`session_read`):
        the agent behind it has read what it read."""
        state = self._sessions.get(session)
        if state is not None:
            state.results.clear()
            state.by_serial.clear()
            state.exact.clear()
            state.blocks.clear()
            state.size = 0

    def forget(self, session: str) -> None:
        """Drop what `session` was delivered, its taint too: for a session that has ended (its kernel is
        gone), never on anything the kernel asks for."""
        self._sessions.pop(session, None)


def _shares_run(text: str, i: int, width: int, source: str, minimum: int) -> bool:
    """Whether `text`'s block at `i` occurs in `source` inside a common run of at least `minimum` chars
    (each side extended at most `minimum` characters: the cost stays bounded whatever the lengths)."""
    block = text[i : i + width]
    start = source.find(block)
    tries = 0
    need = minimum - width
    while start != -1 and tries < 4:
        left = 0
        while left < need and left < i and left < start and text[i - 1 - left] == source[start - 1 - left]:
            left += 1
        right = 0
        end, source_end = i + width, start + width
        while (
            left + right < need
            and end + right < len(text)
            and source_end + right < len(source)
            and text[end + right] == source[source_end + right]
        ):
            right += 1
        if left + right >= need:
            return True
        start = source.find(block, start + 1)
        tries += 1
    return False
