"""The check at publish on a started server: a good adapter passes and records its figures (GET shows them); a
deliberately wrong LoRA path in the engine (one module's scale doubled when it stacks an adapter) is caught and
the version refused by name with the figures, nothing stored, unless the request accepts it; the cap on the
reference records a skip; the setting turns it off."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loraplex.adapters import AdapterError
from loraplex.engine.lora import manager
from tests.platform.helpers import auth, create_tenant, error_of, stored_blobs, upload, zip_folder

FIGURES = {
    "passed",
    "max_logit_diff",
    "tokens_equal",
    "tokens",
    "reference_tokens",
    "prompt",
    "seconds",
    "base_logit_diff",
    "tolerance",
}


def test_a_good_adapter_passes_and_records_its_figures(server, adapter_factory) -> None:
    key = create_tenant(server.url, "checked")
    r = upload(server.url, key, "good", archive=zip_folder(adapter_factory("check-good", seed=41)))
    assert r.status_code == 201, r.text
    check = r.json()["publish_check"]
    assert set(check) == FIGURES, check
    assert check["passed"] is True and check["tokens_equal"] is True and check["tokens"] == check["reference_tokens"]
    assert 0 <= check["max_logit_diff"] < 1e-3 and 0 <= check["base_logit_diff"] < 1e-3  # float32 throughout
    assert check["tolerance"] == pytest.approx(0.05 + 4 * check["base_logit_diff"], abs=1e-6)
    assert len(check["tokens"]) == 4 and check["seconds"] > 0
    assert httpx.get(f"{server.url}/v1/adapters/good", headers=auth(key)).json()["publish_check"] == check
    assert r.json()["origin"] == {"kind": "upload"}


def test_a_wrong_kernel_path_is_caught_and_refused(start_server, adapter_factory, wrong_scale) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "caught")
    r = upload(server.url, key, "bent", archive=zip_folder(adapter_factory("check-bent", seed=42)))
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["code"] == "adapter_check_failed" and error["param"] == "name"
    assert "failed the publish check" in error["message"] and "max_logit_diff" in error["message"]
    assert "(tolerance 0.05" in error["message"] and "nothing was stored" in error["message"]
    assert stored_blobs(server.settings.data_dir) == []
    assert httpx.get(f"{server.url}/v1/adapters/bent", headers=auth(key)).status_code == 404


def test_the_request_may_accept_a_failed_check_with_a_warning(start_server, adapter_factory, wrong_scale) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "accepting")
    folder = adapter_factory("check-accepted", seed=43)
    files = {"file": ("adapter.zip", zip_folder(folder), "application/zip")}
    body = {"name": "bent", "accept_failed_check": "true"}
    r = httpx.post(f"{server.url}/v1/adapters", data=body, files=files, headers=auth(key), timeout=60)
    assert r.status_code == 201, r.text
    check = r.json()["publish_check"]
    assert check["passed"] is False and check["accepted_with_warning"] is True
    assert check["max_logit_diff"] > check["tolerance"]
    body["accept_failed_check"] = "maybe"
    r = httpx.post(f"{server.url}/v1/adapters", data=body, files=files, headers=auth(key), timeout=60)
    assert r.status_code == 400 and error_of(r)["param"] == "accept_failed_check"


def test_a_version_the_engine_cannot_load_fails_the_check_whatever_the_flag(
    start_server, adapter_factory, monkeypatch
) -> None:
    """The engine's run ends in an error (the adapter fails to load): nothing to compare is no pass."""

    def broken(adapter: Any, *args: Any, **kwargs: Any) -> Any:
        raise AdapterError("injected: this adapter cannot be stacked", code="invalid_adapter")

    monkeypatch.setattr(manager, "stack_adapter", broken)
    server = start_server("sqlite")
    key = create_tenant(server.url, "unloadable")
    files = {"file": ("adapter.zip", zip_folder(adapter_factory("check-unloadable", seed=44)), "application/zip")}
    for accept in ("false", "true"):
        body = {"name": "broken", "accept_failed_check": accept}
        r = httpx.post(f"{server.url}/v1/adapters", data=body, files=files, headers=auth(key), timeout=60)
        assert r.status_code == 400, r.text
        error = error_of(r)
        assert error["code"] == "adapter_check_failed" and "could not run the adapter on the engine" in error["message"]
        assert "injected: this adapter cannot be stacked" in error["message"]
    assert stored_blobs(server.settings.data_dir) == []


def test_the_cap_records_a_skip_and_the_setting_turns_it_off(start_server, adapter_factory) -> None:
    folder = adapter_factory("check-skipped", seed=44)
    capped = start_server("sqlite", publish_check_max_reference_params=1000)
    key = create_tenant(capped.url, "capped")
    r = upload(capped.url, key, "big-base", archive=zip_folder(folder))
    assert r.status_code == 201, r.text
    skipped = r.json()["publish_check"]["skipped"]
    assert "parameters, over publish_check_max_reference_params (1000)" in skipped
    off = start_server("sqlite", publish_check=False)
    key = create_tenant(off.url, "unchecked")
    r = upload(off.url, key, "plain", archive=zip_folder(folder))
    assert r.status_code == 201 and r.json()["publish_check"] is None


def test_a_reference_that_fails_records_a_skip(start_server, adapter_factory, monkeypatch) -> None:
    from loraplex.platform.adapters.publish_check import PublishCheck

    base_only = PublishCheck._reference_logprobs

    def broken(self: Any, folder: Any, token_ids: Any) -> Any:
        if folder is None:  # the base alone still runs
            return base_only(self, folder, token_ids)
        raise RuntimeError("peft cannot load this")

    monkeypatch.setattr(PublishCheck, "_reference_logprobs", broken)
    server = start_server("sqlite")
    key = create_tenant(server.url, "unreferenced")
    r = upload(server.url, key, "odd", archive=zip_folder(adapter_factory("check-odd", seed=45)))
    assert r.status_code == 201, r.text
    assert r.json()["publish_check"] == {
        "skipped": "the float reference (peft) failed on this adapter: peft cannot load this"
    }


@pytest.mark.slow
def test_the_check_on_the_bundled_model_and_what_it_costs(smol_dir, tmp_path) -> None:
    """SmolLM2-135M (the bundled model, float32 from its GGUF) behind a server: plain and DoRA versions pass with
    the engine within 1e-3 of peft; the seconds each check took are printed (the first loads the reference)."""
    from loraplex.engine import AsyncEngine, EngineArgs
    from loraplex.platform.app import create_app
    from tests.platform.conftest import settings_for
    from tests.platform.helpers import ServerThread, make_peft_adapter

    engine = AsyncEngine(EngineArgs(max_model_len=512, kv_cache_bytes=128 * 1024 * 1024, max_loras=2, max_cpu_loras=4))
    server = ServerThread(create_app(settings_for("sqlite", tmp_path / "data", max_upload_bytes=64 << 20), engine))
    server.start()
    try:
        key = create_tenant(server.url, "smol-checked")
        targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        kinds = {
            "plain": make_peft_adapter(smol_dir, tmp_path / "plain", r=8, seed=3, targets=targets),
            "dora": make_peft_adapter(
                smol_dir, tmp_path / "dora", seed=4, lora_overrides={"use_dora": True}, magnitude_noise=0.3
            ),
            "plain-again": make_peft_adapter(smol_dir, tmp_path / "again", r=16, seed=5, targets=targets),
        }
        for name, folder in kinds.items():
            r = upload(server.url, key, name, archive=zip_folder(folder))
            assert r.status_code == 201, r.text
            check = r.json()["publish_check"]
            assert check["passed"] and check["tokens_equal"] and check["max_logit_diff"] < 1e-3, check
            print(
                f"publish check on SmolLM2-135M, {name}: {check['seconds']} s, max_logit_diff {check['max_logit_diff']}"
            )
    finally:
        server.stop()
        engine.shutdown()
