"""HTTP(S) downloads for imports, every hop through the address policy: the host is resolved and checked once and
the connection made to that address (Host header and TLS server name kept), redirects followed by hand with each
hop checked again (credentials dropped when the host changes), bodies counted against a byte budget WHILE they
arrive, and failures sorted into transient (connection errors, 5xx, 429: retried) and permanent ones."""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loraplex.platform.adapters.imports.ssrf import AddressPolicy, AddressRefused
from loraplex.platform.error_codes import ErrorCode

REDIRECTS = {301, 302, 303, 307, 308}
MAX_REDIRECTS = 5
CHUNK = 1 << 16


class SourceError(Exception):
    """An import's source failed: `code` for the status resource; `transient` ones are retried with backoff."""

    def __init__(self, message: str, *, code: ErrorCode, transient: bool = False) -> None:
        super().__init__(message)
        self.message, self.code, self.transient = message, code, transient


def shown(url: httpx.URL | str) -> str:
    """A URL as logs and errors show it: no user info, no query (a presigned URL's signature is a credential)."""
    u = httpx.URL(str(url))
    return str(u.copy_with(userinfo=b"", query=None, fragment=None))


class _ShownUrls(logging.Filter):
    """httpx logs every request's whole URL at INFO ("HTTP Request: GET <url> ..."): the URLs in its records are
    written as `shown` writes them, so a server at log level info never logs a presigned signature."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, httpx.URL) for a in record.args):
            record.args = tuple(shown(a) if isinstance(a, httpx.URL) else a for a in record.args)
        return True


if not any(isinstance(f, _ShownUrls) for f in logging.getLogger("httpx").filters):
    logging.getLogger("httpx").addFilter(_ShownUrls())


def transport_error(url: httpx.URL | str, exc: httpx.TransportError) -> SourceError:
    """A connection failure: transient (retried), except a TLS certificate the host's name does not match."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return SourceError(f"{shown(url)}: TLS certificate refused ({cause})", code="source_error")
    return SourceError(f"{shown(url)}: {type(exc).__name__} ({exc})", code="source_unreachable", transient=True)


@dataclass
class Budget:
    """Bytes an import may still download, all its files together (the upload size limit)."""

    limit: int
    used: int = 0

    def take(self, n: int, what: str) -> None:
        self.used += n
        if self.used > self.limit:
            raise SourceError(
                f"{what} passed the limit of {self.limit} bytes while downloading (max_upload_bytes)",
                code="source_too_large",
            )


Progress = Callable[[int, int | None], None]  # (bytes of this file so far, its declared size or None)


@dataclass(frozen=True)
class Downloaded:
    path: Path
    size: int
    sha256: str
    etag: str | None


class Fetcher:
    """Requests an import makes, each through the policy; one per import attempt (closed after)."""

    def __init__(
        self, policy: AddressPolicy, *, allow_http: bool, timeout_s: float = 30.0, verify: ssl.SSLContext | bool = True
    ) -> None:
        self.policy = policy
        self.allow_http = allow_http
        # trust_env=False: no proxy from the environment (a proxy would connect to an address nobody checked).
        # The certificate is checked against the URL's host name (sent as SNI), not the address connected to.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s), trust_env=False, follow_redirects=False, verify=verify
        )

    async def close(self) -> None:
        await self.client.aclose()

    def _pinned(self, method: str, url: httpx.URL, headers: dict[str, str]) -> httpx.Request:
        if url.scheme not in ("https", "http") or not url.host:
            raise SourceError(f"{shown(url)}: only https:// URLs are fetched", code="invalid_source")
        if url.scheme == "http" and not self.allow_http:
            raise SourceError(
                f"{shown(url)}: plain http is refused (https only; the setting import_allow_http allows it)",
                code="invalid_source",
            )
        try:
            address = self.policy.resolve(url.host, url.port or (443 if url.scheme == "https" else 80))
        except AddressRefused as exc:
            raise SourceError(f"{shown(url)}: {exc}", code="source_address_refused") from None
        target = url.copy_with(host=str(address))
        host = url.host if url.port is None else f"{url.host}:{url.port}"
        if ":" in url.host and url.port is None:
            host = f"[{url.host}]"
        elif ":" in url.host:
            host = f"[{url.host}]:{url.port}"
        extensions: dict[str, Any] = {"sni_hostname": url.host} if url.scheme == "https" else {}
        return self.client.build_request(method, target, headers={**headers, "Host": host}, extensions=extensions)

    async def open(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        """GET `url`, redirects followed hop by hop through the policy; the response is streamed (close it).
        A 4xx is a permanent SourceError, a 5xx or 429 or a connection failure a transient one."""
        current, sent = httpx.URL(url), dict(headers or {})
        for _ in range(MAX_REDIRECTS + 1):
            request = self._pinned("GET", current, sent)
            try:
                response = await self.client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise transport_error(current, exc) from None
            if response.status_code in REDIRECTS and "location" in response.headers:
                await response.aclose()
                try:
                    following = current.join(response.headers["location"])
                except httpx.InvalidURL:
                    raise SourceError(f"{shown(current)}: a redirect to an invalid URL", code="source_error") from None
                if following.host != current.host:
                    sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                current = following
                continue
            if response.status_code >= 400:
                await response.aclose()
                status = response.status_code
                transient = status >= 500 or status == 429
                raise SourceError(
                    f"{shown(current)} answered {status} {response.reason_phrase}",
                    code="source_unreachable" if transient else "source_error",
                    transient=transient,
                )
            return response
        raise SourceError(f"{shown(url)}: more than {MAX_REDIRECTS} redirects", code="source_error")

    async def json(self, url: str, headers: dict[str, str] | None = None, max_bytes: int = 8 << 20) -> Any:
        response = await self.open(url, headers)
        try:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise SourceError(f"{shown(url)}: answer over {max_bytes} bytes", code="source_error")
        except httpx.TransportError as exc:
            raise transport_error(url, exc) from None
        finally:
            await response.aclose()
        try:
            return httpx.Response(200, content=bytes(body)).json()
        except ValueError:
            raise SourceError(f"{shown(url)} answered something that is not JSON", code="source_error") from None

    async def download(
        self,
        url: str,
        dest: Path,
        budget: Budget,
        progress: Progress,
        headers: dict[str, str] | None = None,
    ) -> Downloaded:
        """Stream `url` into `dest`, hashing and counting as it arrives (over the budget: stopped at once)."""
        # identity: the bytes counted are the bytes stored (no compressed body inflating past the count)
        response = await self.open(url, {**(headers or {}), "Accept-Encoding": "identity"})
        digest, size = hashlib.sha256(), 0
        declared = response.headers.get("content-length")
        total = int(declared) if declared and declared.isdigit() else None
        what = shown(url)
        try:
            if total is not None and budget.used + total > budget.limit:
                budget.take(total, what)  # refused before a byte is read
            progress(0, total)
            with open(dest, "wb") as f:
                async for chunk in response.aiter_raw(CHUNK):
                    budget.take(len(chunk), what)
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    progress(size, total)
        except httpx.TransportError as exc:
            raise transport_error(url, exc) from None
        finally:
            await response.aclose()
        if total is not None and size != total:
            raise SourceError(f"{what}: {size} bytes arrived of {total}", code="source_unreachable", transient=True)
        return Downloaded(dest, size, digest.hexdigest(), response.headers.get("etag"))
