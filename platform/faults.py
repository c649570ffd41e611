"""A dependency failing is an answer, not a 500: what a request met when it failed, by the exception chain it raised.

* the database unreachable (PostgreSQL restarting or refusing connections, a connection dropped): 503
  ``database_unavailable`` with ``Retry-After``;
* the blob store unreachable (S3 or its endpoint down, timing out): 503 ``blob_store_unavailable`` with
  ``Retry-After``;
* the disk full (or over quota) while writing, the files' own or the database's (SQLite's SQLITE_FULL, PostgreSQL's
  disk_full): 507 ``insufficient_storage``; what was being written is removed by the writers as for any failed write
  (nothing half-written is kept, the database's transaction is rolled back);
* an adapter's stored files gone (its blob deleted behind our back): 500 ``adapter_blob_missing`` naming the blob.

The classification reads the exception's causes (SQLAlchemy wraps the driver's error, botocore wraps the socket's),
so a route never has to know which layer failed first.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from loraplex.platform.errors import ApiError
from loraplex.platform.storage.blobstore import BlobMissing

RETRY_AFTER_S = 5  # seconds a client waits before retrying a dependency that is down (a restart takes about this)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]


# PostgreSQL's SQLSTATEs of a server that cannot be reached or is going away: connection exceptions (class 08),
# admin/crash shutdown and "cannot connect now" (a restart), too many connections
_DOWN_STATES = ("57P01", "57P02", "57P03", "53300")


def _database_down(e: BaseException, chain: list[BaseException]) -> bool:
    import sqlalchemy.exc

    if isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        return True
    if isinstance(e, sqlalchemy.exc.DBAPIError) and e.connection_invalidated:
        return True
    state = getattr(e, "sqlstate", None)
    if isinstance(state, str) and (state.startswith("08") or state in _DOWN_STATES):
        return True
    if state == "55000" and "accepting connections" in str(e):  # ALLOW_CONNECTIONS false, a database being dropped
        return True
    driver = type(e).__module__.split(".")[0]
    if driver == "asyncpg" and type(e).__name__ in ("InterfaceError", "ConnectionDoesNotExistError"):
        return True  # (a connection closed under the pool)
    # the socket's own error, under a database driver's
    database = any(isinstance(x, sqlalchemy.exc.DBAPIError) for x in chain)
    return database and isinstance(e, (ConnectionRefusedError, ConnectionResetError, TimeoutError))


def _blob_store_down(e: BaseException) -> bool:
    try:
        import botocore.exceptions as bx
    except ImportError:
        return False
    return isinstance(
        e, (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.ConnectTimeoutError, bx.ReadTimeoutError)
    )


_SQLITE_FULL = 13  # SQLite's "database or disk is full" (its own code: the file system's ENOSPC is not raised)
_PG_DISK_FULL = "53100"  # PostgreSQL's disk_full SQLSTATE


def _disk_full(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
        return True
    return getattr(e, "sqlstate", None) == _PG_DISK_FULL


def dependency_error(exc: BaseException) -> ApiError | None:
    """The answer for a request that failed on a dependency, or None (a bug: the 500 stays)."""
    chain = list(_chain(exc))
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if any(_blob_store_down(e) for e in chain):
        return ApiError(
            503, "the adapter blob store is unreachable; retry later", code="blob_store_unavailable", headers=retry
        )
    if any(_disk_full(e) for e in chain):  # first: a full disk under the database is not the database down
        return ApiError(507, "the server's disk is full: nothing was stored; retry later", code="insufficient_storage")
    if any(_database_down(e, chain) for e in chain):
        return ApiError(503, "the database is unreachable; retry later", code="database_unavailable", headers=retry)
    missing = next((e for e in chain if isinstance(e, BlobMissing)), None)
    if missing is not None:
        return ApiError(500, f"{missing}; upload this version again", code="adapter_blob_missing")
    return None
