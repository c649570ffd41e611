"""The one HTTP helper of the tenant commands: where the server is (login profile, overridden by
LORAPLEX_BASE_URL / LORAPLEX_API_KEY), requests with the key, API errors mapped to exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from tqdm import tqdm

from loraplex import envvars
from loraplex.platform.client import profile

EXIT_OK, EXIT_USAGE, EXIT_REFUSED, EXIT_SERVER = 0, 2, 3, 4


class UsageError(Exception):
    """A command the user must change (exit 2), found after argparse: no profile, a bad folder, ..."""


class ApiError(Exception):
    """A refusal (4xx: exit 3), a server error (5xx: exit 4) or an unreachable server (status 0: exit 4)."""

    def __init__(self, status: int, code: str, param: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.message = status, code, param, message

    @property
    def exit_code(self) -> int:
        return EXIT_REFUSED if 400 <= self.status < 500 else EXIT_SERVER

    def __str__(self) -> str:
        param = f" (param {self.param})" if self.param else ""
        return f"error {self.code}{param}: {self.message}"


def seg(value: str) -> str:
    """One path segment (`name` or `name@N`), escaped."""
    return quote(value, safe="@")


def _error_of(r: httpx.Response) -> ApiError:
    try:
        body = r.json()["error"]
        return ApiError(r.status_code, body.get("code") or f"http_{r.status_code}", body.get("param"), body["message"])
    except (ValueError, KeyError, TypeError):
        return ApiError(r.status_code, f"http_{r.status_code}", None, r.text[:500] or r.reason_phrase)


class Api:
    """An httpx client on one server with one key; every non-2xx answer raises ApiError."""

    def __init__(self, base_url: str, api_key: str, timeout: float = 60.0) -> None:
        self.base_url, self.api_key = base_url.rstrip("/"), api_key
        self.client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", None, f"cannot reach {self.base_url}: {exc}") from exc
        if r.status_code >= 400:
            raise _error_of(r)
        return r

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def download(self, path: str, dest: Path, desc: str) -> Path:
        """Stream a response body into `dest`, with a progress bar on stderr (when it is a terminal)."""
        try:
            with self.client.stream("GET", path) as r:
                if r.status_code >= 400:
                    r.read()
                    raise _error_of(r)
                total = int(r.headers.get("content-length", 0)) or None
                with (
                    open(dest, "wb") as f,
                    tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=None) as bar,
                ):
                    for chunk in r.iter_bytes():
                        f.write(chunk)
                        bar.update(len(chunk))
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", None, f"cannot reach {self.base_url}: {exc}") from exc
        return dest

    def close(self) -> None:
        self.client.close()


@dataclass
class Connection:
    api: Api
    profile: str | None  # the profile the key came from (None: LORAPLEX_API_KEY)
    tenant: str | None  # the tenant saved with that key at login, if any


def connect(args: argparse.Namespace) -> Connection:
    """The server and key to use: LORAPLEX_BASE_URL / LORAPLEX_API_KEY over the profile's."""
    saved = profile.load(args.profile) or {}
    base_url = envvars.client_base_url() or saved.get("base_url")
    env_key = envvars.client_api_key()
    api_key = env_key or saved.get("api_key")
    if not base_url or not api_key:
        raise UsageError(
            f"no server for profile {args.profile!r}: run `loraplex login` or set LORAPLEX_BASE_URL and "
            "LORAPLEX_API_KEY"
        )
    from_profile = env_key is None or env_key == saved.get("api_key")
    return Connection(
        Api(base_url, api_key), args.profile if from_profile else None, saved.get("tenant") if from_profile else None
    )


Handler = Callable[[argparse.Namespace, Connection], int]


def run_guarded(body: Callable[[], int]) -> int:
    """Run a command, printing its error and returning the documented exit code."""
    try:
        return body()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def client_command(handler: Handler) -> Callable[[argparse.Namespace], int]:
    """An argparse `func` that connects, runs `handler` and maps its errors to exit codes."""

    def run(args: argparse.Namespace) -> int:
        def body() -> int:
            conn = connect(args)
            try:
                return handler(args, conn)
            finally:
                conn.api.close()

        return run_guarded(body)

    return run


def tenant_of(args: argparse.Namespace, conn: Connection) -> str:
    """The caller's tenant: --tenant, the one saved at login, or the owner of its adapters and endpoints."""
    if getattr(args, "tenant", None):
        return str(args.tenant)
    if conn.tenant:
        return conn.tenant
    found = discover_tenant(conn.api)
    if found is None:
        raise UsageError("the key's tenant is unknown: pass --tenant NAME (or `loraplex login --tenant NAME`)")
    return found


def discover_tenant(api: Api) -> str | None:
    """The tenant named as owner of the caller's adapter and endpoint models (None while it has none)."""
    cards = api.json("GET", "/v1/models")["data"]
    owners = {c.get("owned_by") for c in cards[1:]}  # the first card is the base model
    return owners.pop() if len(owners) == 1 else None
