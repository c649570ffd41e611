"""How many adapter uploads run at once: at most `max_concurrent_uploads` in this server process and
`max_concurrent_uploads_per_tenant` for one tenant in it. An upload holds its slot from its first byte to
its answer (receiving, extracting, checking and storing it all take disk and CPU); one over a limit is a
429 naming the limit. Counts live in the process: replicas each apply the limits to their own uploads,
and a crash cannot leave a count behind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from loraplex.platform.domain_errors import RateLimited
from loraplex.platform.tenants.service import Principal

RETRY_AFTER_S = 5  # a small upload takes about this long


class UploadSlots:
    def __init__(self, per_server: int, per_tenant: int) -> None:
        self.per_server = per_server
        self.per_tenant = per_tenant
        self._total = 0
        self._by_tenant: Counter[str] = Counter()

    def in_progress(self, tenant_id: str | None = None) -> int:
        """Uploads holding a slot (of one tenant, or all)."""
        return self._total if tenant_id is None else self._by_tenant[tenant_id]

    @contextmanager
    def hold(self, principal: Principal) -> Iterator[None]:
        """Take a slot for the duration of the block, or raise a 429.

        Called on the event loop with no await between the checks and the count, so no lock is needed."""
        tenant = principal.tenant_id
        if self._by_tenant[tenant] >= self.per_tenant:
            raise _busy(
                f"tenant {principal.tenant_name!r} already has {self._by_tenant[tenant]} adapter uploads in "
                f"progress, the limit max_concurrent_uploads_per_tenant = {self.per_tenant}"
            )
        if self._total >= self.per_server:
            raise _busy(
                f"this server already has {self._total} adapter uploads in progress, "
                f"the limit max_concurrent_uploads = {self.per_server}"
            )
        self._total += 1
        self._by_tenant[tenant] += 1
        try:
            yield
        finally:
            self._total -= 1
            self._by_tenant[tenant] -= 1
            if not self._by_tenant[tenant]:
                del self._by_tenant[tenant]


def _busy(detail: str) -> RateLimited:
    return RateLimited(
        f"too many concurrent uploads: {detail}; retry when one has finished",
        code="too_many_uploads",
        retry_after_s=RETRY_AFTER_S,
    )
