"""From registry records to the engine's AdapterRef (content hash + where the LoRA manager loads it
from), and back from content hashes to public names for metrics."""

from __future__ import annotations

from collections import OrderedDict

from loraplex.engine import AdapterRef
from loraplex.platform.services.adapters import AdapterRecord
from loraplex.platform.services.blobstore import BlobStore

_MAX_NAMES = 4096


class EngineAdapters:
    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._names: OrderedDict[str, str] = OrderedDict()

    def ref(self, record: AdapterRecord) -> AdapterRef:
        self._names[record.sha256] = record.name
        self._names.move_to_end(record.sha256)
        while len(self._names) > _MAX_NAMES:
            self._names.popitem(last=False)
        return AdapterRef(content_hash=record.sha256, path=str(self.store.path(record.blob)), name=record.name)

    def names(self, content_hashes: list[str]) -> list[str]:
        """Public model names for the engine's adapter hashes (the hash itself if not seen here)."""
        return [self._names.get(h, h) for h in content_hashes]
