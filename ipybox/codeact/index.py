"""`search_tools`: a full-text index (SQLite FTS5, BM25 ranking) over the generated tool modules and the
saved code actions of a workspace, so an agent reads only the interfaces that match its task.

What is indexed (by parsing with `ast`; nothing is imported or run):
- each generated tool module `mcptools/<server>/<module>.py`: `TOOL_NAME`, the module name and the
  server (split on `_` and camelCase, so `searchRepositories` matches "repositories"), the module
  docstring (the tool's description, without the generator's boilerplate), the field names of `Params`,
  and `run()`'s signature (with `run_parsed()` when the tool has an output parser);
- each saved action `gentools/<category>/<name>/api.py`: its names (and its MCP tool name
  `<category>__<name>`), `run()`'s docstring and the module docstring, `Params`' field names and `run()`'s
  signature.

Ranking is SQLite's built-in `bm25()` with column weights (a name counts 10x, the server or category 4x,
a parameter name 2x the description), summed over two FTS5 tables of the same text: one stemmed, one
not, so that the exact word ranks above another of the same stem. No hand-written scorer. A query is any text: it is cut into word
tokens, each quoted (`"tok"`, and `"tok"*` for a prefix match when it has 3 or more characters) and OR-ed,
so query syntax (`"`, `NEAR(`, `*`, `-`, `:`) is never passed through. The tokenizer (`porter unicode61
remove_diacritics 2`) stems English words and folds accents: "commits" finds `list_commits`, "cafe"
finds "café".

The files are agent-written or kernel-writable, so they are untrusted: directories are opened one level at
a time without following symlinks (a symlinked server, category or action directory is skipped, and with
it anything outside the workspace), only regular files are read, at most `MAX_FILE_BYTES` each (a larger
one is skipped without being read), at most `MAX_FILES` files per sync, names that are not Python
identifiers (and directories starting with `.`, the generator's and saver's staging directories) are
skipped, and every string taken from a file is capped and stripped of what SQLite cannot store (lone
surrogates, NUL).

`sync()` compares each file's `(size, mtime_ns, inode)` with what the index recorded and parses only
files that differ (the generator and the saver replace files by rename, so a regenerated module always
has a new inode), and deletes the entries of files that are gone; `search()` syncs first, so a saved
action or a regenerated server is found by the next search without anyone telling the index.

Measured over 500 generated tools (10 servers x 50; `python -m bench apigen --only tool_search`, 2 cores,
load ~1.9 from other work): full build on an empty database 282 ms (parsing 500 modules); `sync()` with
nothing changed 2.4 ms (500 `stat`s; what the index holds is cached while `PRAGMA data_version` says no
other connection wrote); after one server was regenerated 45 ms; `search(limit=5)` median 7.3 ms, p95
16 ms, sync included (the query alone ~3 ms). Per task an agent reads ~820 tokens (the 5 hits plus the
right module) instead of ~1,850 (the server's index plus the module) or ~24,600 (the whole server).

The database is a file the caller chooses (in the workspace's state directory, in WAL mode) or memory.
A file that is not an index of this version (corrupt, foreign, older, built for another `mcptools/`) is
deleted and rebuilt: it is a cache of the files, never an error. One connection per index, shared by
threads (the MCP server calls it through `asyncio.to_thread`) under a lock.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import logging
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ipybox.codeact.layout import API_MODULE, GENTOOLS, action_tool_name
from ipybox.mcp_apigen.literals import first_line
from ipybox.safefs import DIR_FLAGS

logger = logging.getLogger(__name__)

MAX_FILE_BYTES: Final = 1 << 20
"""A module larger than this is not indexed (generated modules are ~2-6 KB)."""
MAX_FILES: Final = 20_000
"""At most this many files are looked at per sync (a bound on work a kernel could make the host do)."""
MAX_QUERY_TOKENS: Final = 32
MAX_LIMIT: Final = 200
SIGNATURE_CHARS: Final = 160

# Bump when the schema or what is indexed changes: an index of another version is rebuilt.
_SCHEMA_VERSION: Final = 1
_APPLICATION_ID: Final = 0x69707869  # "ipxi": tells our index files from any other SQLite file
# bm25() weights, in column order: name, group, description, params (the unindexed columns get 0).
_WEIGHTS: Final = (10.0, 4.0, 1.0, 2.0)
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
_DESCRIPTION_CHARS: Final = 8000
_NAME_CHARS: Final = 200
_ANNOTATION_CHARS: Final = 40
# The generator's paragraphs in every module docstring: not the tool's description.
_BOILERPLATE: Final = re.compile(r"^(MCP tool .* generated by ipybox\. Do not edit\.|Output parser: )", re.S)
_WORD: Final = re.compile(r"[^\W_]+")
_CAMEL: Final = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^\W\d_A-Za-z]+")
_UNSTORABLE: Final = re.compile(r"[\x00\ud800-\udfff]")

_SCHEMA: Final = f"""
CREATE TABLE files (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    entry INTEGER
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE VIRTUAL TABLE entries USING fts5(
    name, grp, description, params,
    kind UNINDEXED, module UNINDEXED, path UNINDEXED, signature UNINDEXED, summary UNINDEXED,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
-- The same text, not stemmed (same rowids): its bm25() is added, so the exact word ranks above another
-- word of the same stem ("commits" puts list_commits above get_commit).
CREATE VIRTUAL TABLE exact USING fts5(
    name, grp, description, params, tokenize = 'unicode61 remove_diacritics 2'
);
PRAGMA application_id = {_APPLICATION_ID};
PRAGMA user_version = {_SCHEMA_VERSION};
"""


@dataclass(frozen=True)
class ToolHit:
    """One search result.

    Attributes:
        kind: `mcp_tool` (a generated module) or `code_action` (a saved action).
        module: What to import: `mcptools.github.search_repositories`, `gentools.github.commits_of_top_repos`.
        path: The file an agent reads for the interface, relative to the workspace (`mcptools/github/
            search_repositories.py`, `gentools/github/commits_of_top_repos/api.py`).
        signature: One line: `run(params: Params) -> Result` (and `run_parsed(...) -> ParseResult` when a
            parser exists), with `Params`' field names: `run(Params(query: str, page: int = ...)) -> str`.
        description: The first sentence of the tool's or action's description (at most 200 characters).
        score: BM25 relevance (higher is better).
    """

    kind: Literal["mcp_tool", "code_action"]
    module: str
    path: str
    signature: str
    description: str
    score: float


@dataclass(frozen=True)
class _Entry:
    """What the index keeps of one file."""

    name: str
    group: str
    description: str
    params: str
    kind: Literal["mcp_tool", "code_action"]
    module: str
    path: str
    signature: str
    summary: str


@dataclass(frozen=True)
class _File:
    """A file found by the scan: its key in the index, how to open it, and how to read what is in it."""

    path: str  # relative to the workspace: the key
    dir_fd: int
    name: str
    kind: Literal["mcp_tool", "code_action"]
    group: str  # server or category
    item: str  # module or action name
    stamp: tuple[int, int, int]  # size, mtime_ns, inode


class ToolIndex:
    """The index of one workspace's `mcptools/` and `gentools/` (files are parsed, never imported).

    Args:
        mcptools_dir: The generated packages' directory; `gentools/` is next to it.
        db_path: Where the index is kept (`None`: in memory).
    """

    def __init__(self, mcptools_dir: Path, db_path: Path | None = None) -> None:
        self.mcptools_dir = Path(mcptools_dir)
        self.gentools_dir = self.mcptools_dir.parent / GENTOOLS
        self.db_path = db_path
        self._package = self.mcptools_dir.name or "mcptools"
        self._lock = threading.Lock()
        self._known_cache: tuple[int, dict[str, tuple[int, int, int, int | None]]] | None = None
        self._db: sqlite3.Connection | None = self._open()

    def __enter__(self) -> ToolIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- The database.

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:
            if self.db_path is None or _busy(e):
                raise
            logger.warning("rebuilding the tool index %s: %s", self.db_path, e)
            self._delete_db()
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        target = ":memory:" if self.db_path is None else str(self.db_path)
        db = sqlite3.connect(target, check_same_thread=False, timeout=10.0, isolation_level=None)
        try:
            if self.db_path is not None:
                db.execute("PRAGMA journal_mode = WAL")
                # A cache of the files: losing the last sync on power loss costs one re-parse.
                db.execute("PRAGMA synchronous = NORMAL")
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables == 0:
                db.executescript(_SCHEMA)
            elif (app_id, version) != (_APPLICATION_ID, _SCHEMA_VERSION):
                raise sqlite3.DatabaseError(
                    f"not a tool index of version {_SCHEMA_VERSION} (application_id {app_id}, version {version})"
                )
            else:
                ok = db.execute("PRAGMA quick_check").fetchone()[0]
                if ok != "ok":
                    raise sqlite3.DatabaseError(f"quick_check: {ok}")
            root = str(self.mcptools_dir.absolute())
            row = db.execute("SELECT value FROM meta WHERE key = 'root'").fetchone()
            if row is None or row[0] != root:
                # Built for another mcptools/ (a copied state dir): its entries mean nothing here.
                with _transaction(db):
                    db.execute("DELETE FROM files")
                    db.execute("DELETE FROM entries")
                    db.execute("DELETE FROM exact")
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('root', ?)", (root,))
        except BaseException:
            db.close()
            raise
        return db

    def _delete_db(self) -> None:
        assert self.db_path is not None
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.db_path}{suffix}")

    def _rebuild(self, error: sqlite3.DatabaseError) -> sqlite3.Connection:
        """After the database failed under us (corrupted while open): start over from the files."""
        logger.warning("rebuilding the tool index %s: %s", self.db_path or ":memory:", error)
        if self._db is not None:
            self._db.close()
        self._db = None
        self._known_cache = None
        if self.db_path is not None:
            self._delete_db()
        self._db = self._connect()
        return self._db

    def _database(self) -> sqlite3.Connection:
        if self._db is None:
            raise ValueError("the tool index is closed")
        return self._db

    # -- Public operations.

    def sync(self) -> int:
        """Bring the index up to date with the files (only files whose size or mtime changed are parsed
        again); returns how many entries changed."""
        with self._lock:
            db = self._database()
            try:
                return self._sync(db)
            except sqlite3.DatabaseError as e:
                if _busy(e):
                    raise
                return self._sync(self._rebuild(e))

    def search(self, query: str, limit: int = 10) -> list[ToolHit]:
        """The best `limit` matches of `query` (any words; no query syntax), after a `sync()`."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be a positive whole number, not {limit!r}")
        if not isinstance(query, str):
            raise ValueError(f"query must be text, not {type(query).__name__}")
        match = fts_query(query)
        with self._lock:
            db = self._database()
            try:
                self._sync(db)
                rows = self._search(db, match, min(limit, MAX_LIMIT)) if match else []
            except sqlite3.DatabaseError as e:
                if _busy(e):
                    raise
                db = self._rebuild(e)
                self._sync(db)
                rows = self._search(db, match, min(limit, MAX_LIMIT)) if match else []
        return [
            ToolHit(
                kind="code_action" if kind == "code_action" else "mcp_tool",
                module=module,
                path=path,
                signature=signature,
                description=summary,
                score=-rank,
            )
            for kind, module, path, signature, summary, rank in rows
        ]

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _search(
        self, db: sqlite3.Connection, match: str, limit: int
    ) -> list[tuple[str, str, str, str, str, float]]:
        weights = ", ".join(str(w) for w in _WEIGHTS)
        unindexed = ", 0.0" * 5
        return db.execute(
            "SELECT s.kind, s.module, s.path, s.signature, s.summary, s.rank + coalesce(x.rank, 0.0) AS score "
            f"FROM (SELECT rowid, kind, module, path, signature, summary, bm25(entries, {weights}{unindexed}) "
            "AS rank FROM entries WHERE entries MATCH ?) AS s "
            f"LEFT JOIN (SELECT rowid, bm25(exact, {weights}) AS rank FROM exact WHERE exact MATCH ?) AS x "
            "ON x.rowid = s.rowid ORDER BY score, s.path LIMIT ?",
            (match, match, limit),
        ).fetchall()

    # -- Sync.

    def _sync(self, db: sqlite3.Connection) -> int:
        # Stat (and parse) without holding the write lock; the write transaction re-reads what the index
        # holds, so another index on the same file that synced meanwhile is neither undone nor doubled.
        with contextlib.ExitStack() as fds:
            known = self._known(db)
            seen: set[str] = set()
            changed_files = list(self._scan(fds, known, seen))
            vanished = known.keys() - seen
            if not changed_files and not vanished:
                return 0
            parsed = [(file.path, *self._read(file)) for file in changed_files]
        changed = 0
        with _transaction(db):
            known = self._known(db, fresh=True)
            for path, entry, stamp in parsed:
                old = known.get(path)
                if old is not None and old[:3] == stamp:
                    continue
                if old is not None and old[3] is not None:
                    db.execute("DELETE FROM entries WHERE rowid = ?", (old[3],))
                    db.execute("DELETE FROM exact WHERE rowid = ?", (old[3],))
                    changed += 1
                rowid = None
                if entry is not None:
                    rowid = self._insert(db, entry)
                    changed += 1 if old is None or old[3] is None else 0
                db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)", (path, *stamp, rowid))
            for path in vanished:
                if path not in known:
                    continue
                db.execute("DELETE FROM files WHERE path = ?", (path,))
                rowid = known[path][3]
                if rowid is not None:
                    db.execute("DELETE FROM entries WHERE rowid = ?", (rowid,))
                    db.execute("DELETE FROM exact WHERE rowid = ?", (rowid,))
                    changed += 1
        self._known_cache = None  # our own commit does not change data_version: read it anew next time
        return changed

    def _known(
        self, db: sqlite3.Connection, fresh: bool = False
    ) -> dict[str, tuple[int, int, int, int | None]]:
        """What the index holds: path -> (size, mtime_ns, inode, rowid of its entry or None). Kept between
        syncs while `PRAGMA data_version` says no other connection committed (it ignores our own)."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if fresh or self._known_cache is None or self._known_cache[0] != version:
            rows = db.execute("SELECT * FROM files")
            self._known_cache = (version, {row[0]: (row[1], row[2], row[3], row[4]) for row in rows})
        return self._known_cache[1]

    @staticmethod
    def _insert(db: sqlite3.Connection, entry: _Entry) -> int | None:
        cursor = db.execute(
            "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.name,
                entry.group,
                entry.description,
                entry.params,
                entry.kind,
                entry.module,
                entry.path,
                entry.signature,
                entry.summary,
            ),
        )
        db.execute(
            "INSERT INTO exact (rowid, name, grp, description, params) VALUES (?, ?, ?, ?, ?)",
            (cursor.lastrowid, entry.name, entry.group, entry.description, entry.params),
        )
        return cursor.lastrowid

    def _scan(
        self, fds: contextlib.ExitStack, known: dict[str, tuple[int, int, int, int | None]], seen: set[str]
    ) -> Iterator[_File]:
        """The files to index that differ from what the index holds (`known`); adds every file found to
        `seen`. Directories are opened without following symlinks."""
        count = 0
        tools_fd = _open_dir(self.mcptools_dir, None)
        if tools_fd is not None:
            fds.callback(os.close, tools_fd)
            for server in _subdirs(tools_fd):
                server_fd = _open_dir(server, tools_fd)
                if server_fd is None:
                    continue
                fds.callback(os.close, server_fd)
                for name in _names(server_fd):
                    stem, _, suffix = name.rpartition(".")
                    if suffix != "py" or not _is_name(stem) or stem == "__init__":
                        continue
                    stamp = _stamp(server_fd, name)
                    if stamp is None:
                        continue
                    count += 1
                    if count > MAX_FILES:
                        logger.warning("tool index: more than %d files, the rest is not indexed", MAX_FILES)
                        return
                    path = f"{self._package}/{server}/{name}"
                    seen.add(path)
                    old = known.get(path)
                    if old is None or old[:3] != stamp:
                        yield _File(path, server_fd, name, "mcp_tool", server, stem, stamp)
        gentools_fd = _open_dir(self.gentools_dir, None)
        if gentools_fd is None:
            return
        fds.callback(os.close, gentools_fd)
        for category in _subdirs(gentools_fd):
            category_fd = _open_dir(category, gentools_fd)
            if category_fd is None:
                continue
            fds.callback(os.close, category_fd)
            for action in _subdirs(category_fd):
                action_fd = _open_dir(action, category_fd)
                if action_fd is None:
                    continue
                fds.callback(os.close, action_fd)
                name = f"{API_MODULE}.py"
                stamp = _stamp(action_fd, name)
                if stamp is None:
                    continue
                count += 1
                if count > MAX_FILES:
                    logger.warning("tool index: more than %d files, the rest is not indexed", MAX_FILES)
                    return
                path = f"{GENTOOLS}/{category}/{action}/{name}"
                seen.add(path)
                old = known.get(path)
                if old is None or old[:3] != stamp:
                    yield _File(path, action_fd, name, "code_action", category, action, stamp)

    def _read(self, file: _File) -> tuple[_Entry | None, tuple[int, int, int]]:
        """The entry for a file (`None` if it cannot be read or parsed, or is no tool module), and the
        stamp of what was read."""
        try:
            fd = os.open(file.name, _READ_FLAGS, dir_fd=file.dir_fd)
        except OSError:
            return None, file.stamp
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            stamp = (info.st_size, info.st_mtime_ns, info.st_ino)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
                return None, stamp
            data = handle.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            return None, stamp
        try:
            tree = ast.parse(data.decode("utf-8"), filename=file.path)
            parsed = _parse_tool(tree) if file.kind == "mcp_tool" else _parse_action(tree)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            # Not importable either: nothing to advertise (the saver's and reconciler's checks report it).
            logger.info("tool index: skipped %s: %s", file.path, e)
            return None, stamp
        if parsed is None:
            return None, stamp
        names, description, params, signature = parsed
        if file.kind == "mcp_tool":
            module = f"{self._package}.{file.group}.{file.item}"
            names = [*names, file.item]
        else:
            module = f"{GENTOOLS}.{file.group}.{file.item}"
            names = [file.item, action_tool_name(file.group, file.item)]
        entry = _Entry(
            name=_name_text(names),
            group=_name_text([file.group]),
            description=_clean(description, _DESCRIPTION_CHARS),
            params=_name_text(params),
            kind=file.kind,
            module=module,
            path=file.path,
            signature=_clean(signature, SIGNATURE_CHARS * 2),
            summary=_clean(first_line(description, 200), 300),
        )
        return entry, stamp


def fts_query(text: str) -> str:
    """An FTS5 query matching any word of `text` (each token quoted; `"tok"*` prefix terms for tokens of 3
    or more characters): whatever `text` holds, it is never FTS5 syntax. Empty if it has no words."""
    terms: list[str] = []
    for token in _tokens(text[:4000]):
        if len(terms) >= MAX_QUERY_TOKENS * 2:
            break
        quoted = '"' + token[:64].replace('"', '""') + '"'
        terms.append(quoted)
        if len(token) >= 3:
            terms.append(quoted + "*")
    return " OR ".join(terms)


# -- Reading modules (ast only).


def _parse_tool(tree: ast.Module) -> tuple[list[str], str, list[str], str] | None:
    """A generated module's names, description, parameter names and signature; `None` if it has no
    `run()` (not a tool module)."""
    body = {_defined(node): node for node in tree.body if _defined(node)}
    run = body.get("run")
    if not isinstance(run, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    names = [value for key in ("TOOL_NAME", "SERVER_NAME") if (value := _str_constant(body.get(key)))]
    doc = ast.get_docstring(tree) or ""
    description = "\n\n".join(p for p in re.split(r"\n\s*\n", doc) if not _BOILERPLATE.match(p.strip()))
    fields = _fields(body.get("Params"))
    signature = _function_signature(run, fields)
    parsed = body.get("run_parsed")
    if isinstance(parsed, ast.FunctionDef | ast.AsyncFunctionDef):
        signature += f"; run_parsed(...) -> {_annotation(parsed.returns)}"
    return names, description.strip(), _param_names(run, fields), signature


def _parse_action(tree: ast.Module) -> tuple[list[str], str, list[str], str] | None:
    """A saved action's api.py: `run()`'s docstring (then the module's), parameter names, signature."""
    body = {_defined(node): node for node in tree.body if _defined(node)}
    run = body.get("run")
    if not isinstance(run, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    docs = [ast.get_docstring(run) or "", ast.get_docstring(tree) or ""]
    description = "\n\n".join(doc for doc in docs if doc)
    fields = _fields(body.get("Params"))
    return [], description, _param_names(run, fields), _function_signature(run, fields)


def _defined(node: ast.stmt) -> str:
    """The name a module-level statement defines (a class, function or single-name assignment)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return ""


def _str_constant(node: ast.stmt | None) -> str:
    value = getattr(node, "value", None)
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""


def _fields(node: ast.stmt | None) -> list[str] | None:
    """`Params`' fields as `name: type` (`= ...` when it has a default); `None` without a `Params` class."""
    if not isinstance(node, ast.ClassDef):
        return None
    fields: list[str] = []
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            continue
        if item.target.id.startswith("_") or "ClassVar" in _annotation(item.annotation):
            continue
        text = f"{item.target.id}: {_annotation(item.annotation)}"
        if item.value is not None and _has_default(item.value):
            text += " = ..."
        fields.append(text)
    return fields


def _has_default(value: ast.expr) -> bool:
    """Whether a field's value gives it a default: anything but `Field(...)` without one (`Field(...)`'s
    first argument, `default=` or `default_factory=`)."""
    if not (isinstance(value, ast.Call) and _callee(value.func) == "Field"):
        return True
    if value.args:
        first = value.args[0]
        return not (isinstance(first, ast.Constant) and first.value is Ellipsis)
    return any(k.arg in ("default", "default_factory") for k in value.keywords)


def _callee(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def _function_signature(run: ast.FunctionDef | ast.AsyncFunctionDef, fields: list[str] | None) -> str:
    """`run(Params(a: str, b: int = ...)) -> Result`, cut to about `SIGNATURE_CHARS`."""
    prefix = "async run" if isinstance(run, ast.AsyncFunctionDef) else "run"
    returns = f" -> {_annotation(run.returns)}" if run.returns is not None else ""
    parts: list[str] = []
    params_arg = None
    for arg in _arguments(run):
        if fields is not None and _annotation(arg.annotation) == "Params":
            params_arg = arg
            parts.append("\0")  # the place of Params(...), filled in within the length budget below
        elif arg.annotation is not None:
            parts.append(f"{arg.arg}: {_annotation(arg.annotation)}")
        else:
            parts.append(arg.arg)
    text = f"{prefix}({', '.join(parts)}){returns}"
    if params_arg is not None and fields is not None:
        budget = max(SIGNATURE_CHARS - len(text) - len("Params()"), 10)
        shown: list[str] = []
        for field in fields:
            if len(", ".join([*shown, field])) > budget:
                shown.append("...")
                break
            shown.append(field)
        text = text.replace("\0", f"Params({', '.join(shown)})", 1)
    return text


def _arguments(run: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = run.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


def _param_names(run: ast.FunctionDef | ast.AsyncFunctionDef, fields: list[str] | None) -> list[str]:
    names = [field.partition(":")[0] for field in fields or []]
    names += [arg.arg for arg in _arguments(run) if arg.arg not in ("params", "self")]
    return names


def _annotation(node: ast.expr | None) -> str:
    """An annotation as source, short (`'Result'` as a string annotation is shown as `Result`)."""
    if node is None:
        return "..."
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    else:
        try:
            text = ast.unparse(node)
        except (RecursionError, ValueError):
            return "..."
    text = " ".join(text.split())
    return text if len(text) <= _ANNOTATION_CHARS else text[: _ANNOTATION_CHARS - 3] + "..."


# -- Text.


def _tokens(text: str) -> Iterator[str]:
    """Words of `text`, and the parts of camelCase words (duplicates removed, in order)."""
    seen: set[str] = set()
    for word in _WORD.findall(text):
        for token in (word, *_CAMEL.findall(word)):
            if token.lower() not in seen:
                seen.add(token.lower())
                yield token


def _name_text(names: list[str]) -> str:
    """Names as indexed: each as is, and its `_`/camelCase parts."""
    return _clean(" ".join([*names, *_tokens(" ".join(names))]), _NAME_CHARS * 4)


def _clean(text: str, limit: int) -> str:
    """Text from a file, storable and short."""
    return _UNSTORABLE.sub(" ", text[:limit])


def _is_name(name: str) -> bool:
    return name.isidentifier() and not name.startswith(".")


# -- Files.


def _open_dir(name: str | Path, dir_fd: int | None) -> int | None:
    """A directory opened without following a symlink; `None` if missing, a symlink or no directory."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            logger.warning("tool index: skipped %s: a symlink or not a directory", name)
        elif e.errno != errno.ENOENT:
            logger.warning("tool index: skipped %s: %s", name, e)
        return None


def _names(dir_fd: int) -> list[str]:
    try:
        with os.scandir(dir_fd) as entries:
            return sorted(entry.name for entry in entries)
    except OSError:
        return []


def _subdirs(dir_fd: int) -> list[str]:
    """Package directory names (identifiers; not staging directories `.x`, not `__pycache__`)."""
    return [name for name in _names(dir_fd) if _is_name(name) and not name.startswith("_")]


def _stamp(dir_fd: int, name: str) -> tuple[int, int, int] | None:
    """`(size, mtime_ns, inode)` of a regular file (not a symlink); `None` for anything else."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return info.st_size, info.st_mtime_ns, info.st_ino


def _busy(error: sqlite3.DatabaseError) -> bool:
    """A locked or busy database (another process is writing): not a reason to rebuild it."""
    return isinstance(error, sqlite3.OperationalError) and any(
        word in str(error).lower() for word in ("locked", "busy")
    )


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # a database that broke under us may refuse that too
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
