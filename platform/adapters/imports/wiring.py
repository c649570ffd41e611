"""Builds the import services for one server process and starts its runner (called by the app's lifespan)."""

from __future__ import annotations

from loraplex.platform.adapters.imports.credentials import CredentialStore, server_key
from loraplex.platform.adapters.imports.service import ImportRunner, ImportService
from loraplex.platform.adapters.imports.ssrf import AddressPolicy, parse_networks
from loraplex.platform.container import Services


def start_imports(services: Services) -> ImportRunner:
    """`services.imports` and `services.import_credentials` set, the runner started (the caller closes it)."""
    settings = services.settings
    policy = AddressPolicy(parse_networks(settings.import_allow_networks))
    credentials = CredentialStore(services.db, server_key(settings.import_credentials_key, settings.data_dir))
    imports = ImportService(services.db, services.adapters, policy, credentials)
    runner = ImportRunner(services.db, services.adapters, services.store, credentials, policy, settings)
    imports.on_created = runner.wake
    imports.runner = runner
    services.imports, services.import_credentials = imports, credentials
    runner.start()
    return runner
