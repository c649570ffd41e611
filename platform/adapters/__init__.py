"""Tenants' adapters: upload, versions, retention and rollback (controller, service), the admin's view of any
tenant's adapters, upload slots, warming published versions, and registry records to the engine's AdapterRef."""
