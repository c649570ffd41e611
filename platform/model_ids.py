"""Globally unique, stable model ids for adapters: `<tenant>/<adapter>`.

Tenants keep their short adapter names (`support-bot`); routers, metrics and logs see the qualified id
(`acme/support-bot`), so two tenants' same-named adapters are never one name to a router. Neither name
may contain `/` (`services.tenants.NAME_RE`), so an id splits one way only; tenant names are unique and
never change, so the id is stable. Adapter versions extend the scheme as `<tenant>/<adapter>@N`.
"""

from __future__ import annotations

SEPARATOR = "/"


def adapter_id(tenant: str, adapter: str) -> str:
    """The adapter's globally unique model id."""
    return f"{tenant}{SEPARATOR}{adapter}"


def short_name(model: str, tenant: str) -> str | None:
    """The caller's short adapter name that `model` names (its short name or its qualified id), or None
    when `model` is another tenant's qualified id (answered like a missing model)."""
    owner, sep, name = model.partition(SEPARATOR)
    if not sep:
        return model
    return name if owner == tenant else None
