"""The login profile: base URL, API key and tenant name, in a file only its owner may read.

`$XDG_CONFIG_HOME/loraplex/profile.json` (else `~/.config/loraplex/profile.json`), mode 0600 in a 0700
folder, holding one entry per profile name (`default` unless `--profile NAME`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DEFAULT = "default"


def profile_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "loraplex" / "profile.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return data.get("profiles", {}) if isinstance(data, dict) else {}


def load(name: str) -> dict[str, Any] | None:
    """The profile's fields (`base_url`, `api_key`, `tenant`), or None when it was never saved."""
    return _read(profile_path()).get(name)


def save(name: str, fields: dict[str, Any]) -> Path:
    """Write (or replace) one profile; the file is created 0600 and replaced atomically."""
    path = profile_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    profiles = _read(path)
    profiles[name] = fields
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            json.dump({"profiles": profiles}, f, indent=2)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path
