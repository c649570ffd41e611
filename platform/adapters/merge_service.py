"""Merged adapters: `name`'s next version computed from other versions of the tenant's adapters
(loraplex.adapters.merge), checked like an upload and published through the one path every version takes; from
then on it is an ordinary adapter (endpoints, canaries, rollback). The version records its sources."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from loraplex.adapters import AdapterError, AdapterInfo, load_adapter
from loraplex.adapters.merge import MergeOptions, MergeSource, check_options, merge_adapters
from loraplex.engine.threads import single_threaded_torch
from loraplex.platform.adapters.schemas import MergeIn
from loraplex.platform.adapters.service import AdapterRecord, AdapterService
from loraplex.platform.domain_errors import refused
from loraplex.platform.storage.blobstore import BlobStore
from loraplex.platform.tenants.service import Principal


class MergeService:
    def __init__(self, adapters: AdapterService, store: BlobStore) -> None:
        self.adapters = adapters
        self.store = store

    async def merge(self, principal: Principal, name: str, body: MergeIn) -> AdapterRecord:
        name = self.adapters.check_new_name(name)
        options = MergeOptions(
            method=body.method,
            density=body.density,
            svd_rank=body.svd_rank,
            majority_sign_method=body.majority_sign_method,
            seed=body.seed,
        )
        try:
            check_options(options, len(body.sources))
        except AdapterError as exc:
            raise refused(exc, param="method") from None
        records = [await self.adapters.get(principal, s.model) for s in body.sources]  # 404 names a missing one
        paths = [await asyncio.to_thread(self.store.fetch, r.blob) for r in records]
        workdir = self.store.new_tmp_dir()
        try:
            merged_seed, info, files = await asyncio.to_thread(self._merge, records, paths, body, options, workdir)
            origin: dict[str, object] = {
                "kind": "merge",
                "method": body.method,
                "sources": [
                    {"name": r.name, "version": r.version, "weight": s.weight}
                    for r, s in zip(records, body.sources, strict=True)
                ],
            }
            origin.update(
                {
                    k: v
                    for k, v in (("density", body.density), ("svd_rank", body.svd_rank), ("seed", merged_seed))
                    if v is not None
                }
            )
            if body.method in ("ties", "dare_ties"):
                origin["majority_sign_method"] = body.majority_sign_method
            return await self.adapters.publish(
                principal, name, info, files, origin=origin, accept_failed_check=body.accept_failed_check
            )
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _merge(
        self, records: list[AdapterRecord], paths: list[Path], body: MergeIn, options: MergeOptions, workdir: Path
    ) -> tuple[int | None, AdapterInfo, dict[str, Path]]:
        """In a worker thread: load the sources, merge them, write and check the result like an upload."""
        single_threaded_torch()
        a = self.adapters
        try:
            sources = [
                MergeSource(
                    load_adapter(path, a.base, max_lora_rank=a.max_lora_rank, limits=a.limits),
                    s.weight,
                    f"{r.name}@{r.version}",
                )
                for r, path, s in zip(records, paths, body.sources, strict=True)
            ]
            merged = merge_adapters(sources, options, a.base)
        except AdapterError as exc:
            raise refused(exc, param="sources") from None
        folder = merged.write(workdir / "merged")
        info, files = a.inspect_folder(folder)
        return merged.seed, info, files
