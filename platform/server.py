"""Run the app under uvicorn (what `loraplex serve` does), draining gracefully on SIGTERM / SIGINT."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

from loraplex.platform.app import create_app
from loraplex.platform.drain import Drain
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform")

# After the drain, uvicorn closes the (now idle) connections and runs the lifespan shutdown.
_AFTER_DRAIN_S = 2


class DrainingServer(uvicorn.Server):
    """uvicorn, except that the first exit signal begins a drain and the server exits once it is done; a
    second signal exits at once (uvicorn's own behaviour)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.timeout_s = timeout_s
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining:
            self.force_exit = True
            super().handle_exit(sig, frame)
            return
        self.drain.begin()

    async def on_tick(self, counter: int) -> bool:
        if self.drain.draining and not self._announced:  # logged here, not in the signal handler
            self._announced = True
            log.info("draining: refusing new requests, %d in flight", self.drain.in_flight)
        if not self.should_exit and self.drain.done(self.timeout_s):
            log.info("drained: no request in flight; shutting down")
            self.should_exit = True
        return await super().on_tick(counter)


def run(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=_AFTER_DRAIN_S,
        lifespan="on",
    )
    DrainingServer(config, app.state.drain, settings.drain_timeout_s).run()
