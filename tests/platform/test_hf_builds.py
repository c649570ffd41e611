"""transformers' process-wide functions left swapped by two overlapping model builds (reproduced here by entering
and leaving its own context managers in an overlapping order) spoil every later model: hf_build() puts them back,
so the check at publish (and the tests' own builds) are right again."""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.platform.adapters.hf_builds import hf_build, restore_swapped_functions, swapped_functions
from tests.platform.helpers import create_tenant, upload, zip_folder


def overlap_two_builds() -> None:
    """What two threads' from_pretrained do when their contexts overlap: A enters, B enters (saving A's stand-ins
    as 'the originals'), A leaves, B leaves (putting A's stand-ins back for good)."""
    from transformers.initialization import no_init_weights, no_tie_weights

    for make in (no_init_weights, no_tie_weights):
        a, b = make(), make()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        b.__exit__(None, None, None)


def logits(model_dir: Path) -> tuple[torch.Tensor, bool]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.inference_mode():
        return model(torch.tensor([[1, 5, 9, 2]])).logits, tied


def test_a_build_after_overlapping_builds_is_right_again(tiny_llama_dir: Path) -> None:
    with hf_build():
        clean, tied = logits(tiny_llama_dir)
    assert tied and torch.isfinite(clean).all() and not swapped_functions()
    try:
        overlap_two_builds()
        swapped = {f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in swapped_functions()}
        assert {"PreTrainedModel.tie_weights", "PreTrainedModel.init_weights", "torch.nn.init.normal_"} <= swapped
        spoiled, tied = logits(tiny_llama_dir)  # the harm, shown: lm_head untied, not loaded
        assert not tied and not torch.equal(spoiled, clean)
        with hf_build():
            assert not swapped_functions()
            healed, tied = logits(tiny_llama_dir)
        assert tied and torch.equal(healed, clean)
    finally:
        restore_swapped_functions()


def test_the_check_at_publish_passes_after_overlapping_builds(start_server, adapter_factory, caplog) -> None:
    folder = adapter_factory("hf-builds", seed=77)
    server = start_server("sqlite")
    key = create_tenant(server.url, "healed")
    try:
        overlap_two_builds()
        assert swapped_functions()
        r = upload(server.url, key, "bot", archive=zip_folder(folder))
        assert r.status_code == 201, r.text
        check = r.json()["publish_check"]
        assert check["passed"] is True and check["tokens_equal"] is True and check["max_logit_diff"] < 1e-3, check
        assert "put back before this build" in caplog.text and "PreTrainedModel.tie_weights" in caplog.text
    finally:
        restore_swapped_functions()
