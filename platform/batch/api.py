"""The Batch API's services, built once per server process by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.platform.batch.files import FileService
from loraplex.platform.batch.jobs import BatchService
from loraplex.platform.batch.runner import BatchRunner
from loraplex.platform.container import Services


@dataclass
class BatchApi:
    files: FileService
    jobs: BatchService
    runner: BatchRunner

    @classmethod
    def start(cls, services: Services) -> BatchApi:
        settings = services.settings
        files = FileService(
            services.db, services.store, settings.max_json_depth, settings.max_batch_lines, settings.max_request_bytes
        )
        runner = BatchRunner(services, files)
        runner.start()
        return cls(files, BatchService(services.db, files), runner)

    async def close(self) -> None:
        await self.runner.close()
