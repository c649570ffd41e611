"""From registry records to the engine's AdapterRef (content hash + where the LoRA manager loads it
from), and back from content hashes to public names for metrics."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from loraplex.engine import AdapterRef
from loraplex.platform.errors import ApiError
from loraplex.platform.services.adapters import AdapterRecord
from loraplex.platform.services.blobstore import BlobStore
from loraplex.platform.services.s3_blobstore import BlobCorrupt

_MAX_NAMES = 4096
log = logging.getLogger("loraplex.platform")


class EngineAdapters:
    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._names: OrderedDict[str, str] = OrderedDict()

    async def ref(self, record: AdapterRecord) -> AdapterRef:
        """The engine's ref of an adapter version, its blob made local first (object storage downloads it once)."""
        try:
            path = await asyncio.to_thread(self.store.fetch, record.blob)
        except BlobCorrupt as exc:
            log.error("%s", exc)
            raise ApiError(
                500, f"the stored weights of {record.name}@{record.version} failed verification", code="blob_corrupt"
            ) from None
        self._names[record.sha256] = record.name
        self._names.move_to_end(record.sha256)
        while len(self._names) > _MAX_NAMES:
            self._names.popitem(last=False)
        return AdapterRef(content_hash=record.sha256, path=str(path), name=record.name)

    def names(self, content_hashes: list[str]) -> list[str]:
        """Public model names for the engine's adapter hashes (the hash itself if not seen here)."""
        return [self._names.get(h, h) for h in content_hashes]
