"""Run the app under uvicorn (what `loraplex serve` does)."""

from __future__ import annotations

import logging

import uvicorn

from loraplex.platform.app import create_app
from loraplex.platform.settings import Settings


def run(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
