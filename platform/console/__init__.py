"""The tenant web console: static files (platform/console/static/, no build step) served at /console by the
same server. It is a client of the public API only: it signs in with a tenant key kept in the tab's
sessionStorage and calls the /v1 routes like any other client.

Every response under /console carries a strict Content-Security-Policy (scripts, styles and connections only
from this origin, no inline script or style, no framing), and the scripts render every tenant-supplied string
as text (textContent / text nodes, never HTML), so a hostile adapter, endpoint or batch field stays inert."""

from __future__ import annotations

from pathlib import Path

from litestar import Request, Response, Router
from litestar.exceptions import NotFoundException
from litestar.static_files import create_static_files_router

STATIC_DIR = Path(__file__).parent / "static"
PATH = "/console"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # a new server version's scripts are fetched again (revalidated, not re-sent)
}


async def _secure(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _not_found(request: Request, exc: NotFoundException) -> Response:
    """A missing console file: a plain 404 with the same headers (the app's JSON error handler would drop them)."""
    return Response("not found", status_code=404, media_type="text/plain", headers=SECURITY_HEADERS)


def console_router() -> Router:
    """The static files at /console (index.html for /console/), each response (a 404 too) with the security
    headers."""
    return create_static_files_router(
        path=PATH,
        directories=[STATIC_DIR],
        html_mode=True,
        name="console",
        after_request=_secure,
        exception_handlers={NotFoundException: _not_found},
        include_in_schema=False,
    )
