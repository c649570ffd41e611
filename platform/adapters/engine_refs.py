"""From registry records to the engine's AdapterRef (content hash + where the LoRA manager loads it
from), and back from content hashes to public model ids (`<tenant>/<adapter>`) for metrics. Every version
of an adapter carries the adapter's id: a router keeps all of them on the replicas that serve the adapter,
and a canary between versions happens inside the replica."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from loraplex.engine import AdapterRef
from loraplex.platform.adapters.service import AdapterRecord
from loraplex.platform.domain_errors import Failed
from loraplex.platform.model_ids import adapter_id
from loraplex.platform.storage.blobstore import BlobMissing, BlobStore
from loraplex.platform.storage.s3_blobstore import BlobCorrupt

_MAX_NAMES = 4096
_MAX_IDS_PER_WEIGHTS = 64
log = logging.getLogger("loraplex.platform")


class EngineAdapters:
    def __init__(self, store: BlobStore, on_broken: Callable[[AdapterRecord, str | None], Awaitable[None]]) -> None:
        self.store = store
        # Called with the reason a version's stored files failed to load, and with None when a version marked
        # broken loads again (AdapterService.mark_broken: its tenant sees the mark).
        self.on_broken = on_broken
        # content hash -> the model ids served with those weights (two tenants may upload the same weights:
        # the engine holds them once, and a router must find either id on this replica)
        self._ids: OrderedDict[str, dict[str, None]] = OrderedDict()

    async def ref(self, record: AdapterRecord, tenant: str) -> AdapterRef:
        """The engine's ref of an adapter version, its blob made local first (object storage downloads it once),
        named by the adapter's model id."""
        try:
            path = await asyncio.to_thread(self.store.fetch, record.blob)
        except BlobCorrupt as exc:
            log.error("%s", exc)
            await self.on_broken(record, "its stored weights failed verification")
            raise Failed(
                f"the stored weights of {record.name}@{record.version} failed verification", code="blob_corrupt"
            ) from None
        except BlobMissing as exc:
            log.error("%s", exc)
            await self.on_broken(record, "its stored weights are missing from the blob store")
            raise Failed(
                f"the stored weights of adapter {record.name}@{record.version} are missing from the blob store; "
                "upload this version again",
                code="adapter_blob_missing",
            ) from None
        if record.broken_reason is not None:
            await self.on_broken(record, None)
        model_id = adapter_id(tenant, record.name)
        ids = self._ids.setdefault(record.sha256, {})
        ids.pop(model_id, None)
        ids[model_id] = None  # the most recently used id last
        while len(ids) > _MAX_IDS_PER_WEIGHTS:
            del ids[next(iter(ids))]
        self._ids.move_to_end(record.sha256)
        while len(self._ids) > _MAX_NAMES:
            self._ids.popitem(last=False)
        return AdapterRef(content_hash=record.sha256, path=str(path), name=model_id)

    def names(self, content_hashes: list[str]) -> list[str]:
        """Model ids for the engine's adapter hashes (the hash itself if not seen here)."""
        return [model_id for h in content_hashes for model_id in (self._ids.get(h) or {h: None})]
