"""`phantora query` reads a trace and never changes anything: one statement per query, and that
statement may only read.

The built-in engine enforces it with SQLite's authorizer (`sqlite_authorizer`), which sees every
action a prepared statement takes. Perfetto's trace_processor runs in another process, so its
statements are screened here before they are sent (`check_statement`); the authorizer is still
the real guard for the built-in engine.
"""

from __future__ import annotations

import re
import sqlite3

from phantora.query.errors import QueryError

# Pragmas that only report (schema introspection; their argument names a table or index); every
# other pragma is refused.
READ_ONLY_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "function_list", "pragma_list", "collation_list", "foreign_key_list", "compile_options",
})

_READ_ACTIONS = frozenset({
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
})

# Words that start a statement which changes state, and a statement that may read.
_WRITE_WORDS = ("ATTACH", "DETACH", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "PRAGMA",
                "REPLACE", "VACUUM", "REINDEX", "ANALYZE", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT",
                "RELEASE", "UPSERT")
_READ_STARTS = ("SELECT", "WITH", "VALUES")
_STRINGS_AND_COMMENTS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)


def sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
    """SQLite authorizer that allows reading only (see READ_ONLY_PRAGMAS for pragmas)."""
    if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_ONLY_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def single_statement(statements: list[str], sql: str) -> str:
    """The one statement of a query; QueryError when there are none or several."""
    if len(statements) != 1:
        raise QueryError(f"a query is one SQL statement; this one has {len(statements)} (run them one by one)",
                         sql)
    return statements[0]


def check_statement(statement: str) -> None:
    """QueryError unless `statement` only reads (SELECT / WITH ... SELECT / VALUES)."""
    bare = _STRINGS_AND_COMMENTS.sub(" ", statement)
    words = re.findall(r"[A-Za-z_]+(?=\s*\(?)", bare)
    first = words[0].upper() if words else ""
    if first not in _READ_STARTS:
        raise QueryError(f"phantora query only reads traces: '{first or statement.strip()[:20]}' statements are "
                         "not allowed (use SELECT)", statement)
    for m in re.finditer(r"\b([A-Za-z_]+)\b(\s*\()?", bare):
        word, call = m.group(1).upper(), m.group(2)
        if word in _WRITE_WORDS and not call:  # replace(...) is a string function, REPLACE INTO a write
            raise QueryError(f"phantora query only reads traces: '{word}' is not allowed", statement)
