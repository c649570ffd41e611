"""Who a request is served for: the tenant whose share of the engine it draws on, that tenant's weight, and
its priority class (the scheduler's policies read these; see ``engine.fair_queue``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from loraplex.engine.errors import RequestError

MAX_PRIORITY = 1 << 31


@dataclass(frozen=True)
class Share:
    """``tenant``: the account a request's tokens are charged to ("" for anonymous/offline use).
    ``weight``: the tenant's relative share under ``fair`` scheduling (2 gets twice the tokens of 1).
    ``priority``: lower is served first (vLLM's convention); 0 is interactive, a positive class is background
    work that runs only when nothing of a lower class waits."""

    tenant: str = ""
    weight: float = 1.0
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight) or not 0 < self.weight <= 1e6:
            raise RequestError(f"a tenant's weight must be a finite number in (0, 1e6], got {self.weight!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool) or abs(self.priority) > MAX_PRIORITY:
            raise RequestError(f"priority must be an integer in [-2^31, 2^31], got {self.priority!r}")


DEFAULT_SHARE = Share()
