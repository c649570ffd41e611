"""loraplex.adapters.merge against peft's add_weighted_adapter (the oracle) on the same sources, tensor by tensor,
and its refusals by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora.model import LoraModel
from transformers import LlamaConfig, LlamaForCausalLM

from loraplex.adapters import AdapterError, BaseModelSpec, inspect_adapter, load_adapter
from loraplex.adapters.merge import MergedAdapter, MergeOptions, MergeSource, merge_adapters
from tests.adapters.conftest import MakeAdapter

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _sources(base: BaseModelSpec, folders: list[Path], weights: list[float]) -> list[MergeSource]:
    return [
        MergeSource(load_adapter(f, base, max_lora_rank=64), w, f.name) for f, w in zip(folders, weights, strict=True)
    ]


def _peft_merge(
    config: LlamaConfig, folders: list[Path], weights: list[float], monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """peft's merged adapter "merged": (A, B) per (layer, module)."""
    inject = LoraModel.inject_adapter

    def inject_keeping_rng(self: Any, *args: Any, **kw: Any) -> Any:
        # Creating the new adapter's (zeroed) layers draws from the global generator; the merge's own draws come
        # after it, so the generator is put back as the test seeded it
        state = torch.get_rng_state()
        try:
            return inject(self, *args, **kw)
        finally:
            torch.set_rng_state(state)

    monkeypatch.setattr(LoraModel, "inject_adapter", inject_keeping_rng)
    model = PeftModel.from_pretrained(LlamaForCausalLM(config).eval(), str(folders[0]), adapter_name="s0")
    for i, folder in enumerate(folders[1:], 1):
        model.load_adapter(str(folder), adapter_name=f"s{i}")
    seed = kwargs.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    model.add_weighted_adapter([f"s{i}" for i in range(len(folders))], weights, "merged", **kwargs)
    out = {}
    for layer, decoder in enumerate(model.base_model.model.model.layers):
        for module in MODULES:
            block = decoder.self_attn if module in MODULES[:4] else decoder.mlp
            lora = getattr(block, module)
            if hasattr(lora, "lora_A") and "merged" in lora.lora_A:
                out[(layer, module)] = (lora.lora_A["merged"].weight.detach(), lora.lora_B["merged"].weight.detach())
    return out


def _ours(merged: MergedAdapter, layer: int, module: str) -> tuple[torch.Tensor, torch.Tensor]:
    block = "self_attn" if module in MODULES[:4] else "mlp"
    prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
    return merged.tensors[f"{prefix}.lora_A.weight"], merged.tensors[f"{prefix}.lora_B.weight"]


@pytest.mark.parametrize(
    ("method", "kwargs", "ranks"),
    [
        ("cat", {}, (4, 6)),
        ("linear", {}, (4, 4)),
        ("ties", {"density": 0.5}, (4, 4)),
        ("ties", {"density": 0.7, "majority_sign_method": "frequency"}, (4, 4)),
        ("magnitude_prune", {"density": 0.4}, (4, 4)),
        ("dare_linear", {"density": 0.6, "seed": 1234}, (4, 4)),
        ("dare_ties", {"density": 0.3, "seed": 99}, (4, 4)),
        ("dare_linear", {"density": 1.0}, (4, 4)),
    ],
)
def test_factor_methods_equal_peft(
    method: str,
    kwargs: dict[str, Any],
    ranks: tuple[int, int],
    make_adapter: MakeAdapter,
    tiny_config: LlamaConfig,
    base: BaseModelSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folders = [
        make_adapter("a", seed=1, r=ranks[0], lora_alpha=8)[0],
        make_adapter("b", seed=2, r=ranks[1], lora_alpha=5, use_rslora=True)[0],
    ]
    weights = [0.7, -1.3]
    merged = merge_adapters(_sources(base, folders, weights), MergeOptions(method=method, **kwargs), base)
    expected = _peft_merge(tiny_config, folders, weights, monkeypatch, combination_type=method, **kwargs)
    assert list(expected) == merged.modules  # the model's order (DARE draws in it)
    for (layer, module), (a, b) in expected.items():
        ours_a, ours_b = _ours(merged, layer, module)
        torch.testing.assert_close(ours_a, a, rtol=0, atol=0)
        torch.testing.assert_close(ours_b, b, rtol=0, atol=0)
    assert merged.seed == (kwargs.get("seed") if kwargs.get("density", 1) < 1 else None)


@pytest.mark.parametrize("svd_rank", [None, 3, 10])
def test_svd_equals_peft(
    svd_rank: int | None,
    make_adapter: MakeAdapter,
    tiny_config: LlamaConfig,
    base: BaseModelSpec,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SVD's factors are unique up to signs: the merged deltas B @ A are compared."""
    folders = [make_adapter("a", seed=3, r=4)[0], make_adapter("b", seed=4, r=6, lora_alpha=3)[0]]
    weights = [1.0, 0.5]
    merged = merge_adapters(_sources(base, folders, weights), MergeOptions("svd", svd_rank=svd_rank), base)
    expected = _peft_merge(tiny_config, folders, weights, monkeypatch, combination_type="svd", svd_rank=svd_rank)
    assert merged.rank == (svd_rank or 6)
    for (layer, module), (a, b) in expected.items():
        ours_a, ours_b = _ours(merged, layer, module)
        torch.testing.assert_close(ours_b @ ours_a, b @ a, rtol=1e-4, atol=1e-5)


def test_merged_folder_is_an_adapter_whose_delta_is_the_weighted_sum(
    make_adapter: MakeAdapter, base: BaseModelSpec, tmp_path: Path
) -> None:
    """cat is exact: the written folder passes every upload check and its delta is w1*s1*B1A1 + w2*s2*B2A2."""
    folders = [make_adapter("a", seed=5, r=4)[0], make_adapter("b", seed=6, r=2, lora_alpha=7)[0]]
    sources = _sources(base, folders, [2.0, -0.25])
    folder = merge_adapters(sources, MergeOptions("cat"), base).write(tmp_path / "merged")
    inspect_adapter(folder, base, max_lora_rank=6)
    loaded = load_adapter(folder, base, max_lora_rank=6)
    for key, w in loaded.weights.items():
        want = sum(
            s.weight * s.adapter.weights[key].scaling * (s.adapter.weights[key].b @ s.adapter.weights[key].a)
            for s in sources
        )
        torch.testing.assert_close(w.scaling * (w.b @ w.a), want, rtol=1e-5, atol=1e-6)


def test_dare_without_a_seed_draws_one_and_records_it(make_adapter: MakeAdapter, base: BaseModelSpec) -> None:
    sources = _sources(base, [make_adapter("a", seed=1)[0], make_adapter("b", seed=2)[0]], [1.0, 1.0])
    first = merge_adapters(sources, MergeOptions("dare_linear", density=0.5), base)
    assert first.seed is not None
    again = merge_adapters(sources, MergeOptions("dare_linear", density=0.5, seed=first.seed), base)
    for name, t in first.tensors.items():
        assert torch.equal(t, again.tensors[name])


@pytest.mark.parametrize(
    ("options", "code", "words"),
    [
        (MergeOptions("average"), "unknown_merge_method", "unknown merge method 'average'"),
        (MergeOptions("ties"), "invalid_merge", "needs a density"),
        (MergeOptions("dare_linear", density=0.0), "invalid_merge", "density must be in (0, 1]"),
        (MergeOptions("ties", density=1.5), "invalid_merge", "density must be in (0, 1]"),
        (MergeOptions("linear", density=0.5), "invalid_merge", "takes no density"),
        (MergeOptions("cat", svd_rank=4), "invalid_merge", "svd_rank"),
        (MergeOptions("ties", density=0.5, majority_sign_method="most"), "invalid_merge", "majority_sign_method"),
    ],
)
def test_bad_options_refused_by_name(
    options: MergeOptions, code: str, words: str, make_adapter: MakeAdapter, base: BaseModelSpec
) -> None:
    sources = _sources(base, [make_adapter("a", seed=1)[0], make_adapter("b", seed=2)[0]], [1.0, 1.0])
    with pytest.raises(AdapterError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        merge_adapters(sources, options, base)
    assert err.value.code == code


def test_sources_refused_by_name(make_adapter: MakeAdapter, base: BaseModelSpec) -> None:
    a = make_adapter("a", seed=1)[0]

    def refused(folders: list[Path], weights: list[float], options: MergeOptions) -> AdapterError:
        with pytest.raises(AdapterError) as err:
            merge_adapters(_sources(base, folders, weights), options, base)
        return err.value

    err = refused([a, make_adapter("r8", seed=2, r=8)[0]], [1.0, 1.0], MergeOptions("linear"))
    assert err.code == "merge_rank_mismatch" and "a r=4, r8 r=8" in str(err)
    err = refused(
        [a, make_adapter("qv", seed=3, target_modules=["q_proj", "v_proj"])[0]], [1.0, 1.0], MergeOptions("cat")
    )
    assert err.code == "merge_mismatch" and "target different modules" in str(err)
    err = refused([a, make_adapter("dora", seed=4, use_dora=True)[0]], [1.0, 1.0], MergeOptions("cat"))
    assert err.code == "merge_dora" and "dora is a DoRA adapter" in str(err)
    for bad in (0.0, float("nan"), float("inf"), 1e9):
        err = refused([a, make_adapter("b", seed=5)[0]], [1.0, bad], MergeOptions("cat"))
        assert err.code == "invalid_merge" and "the weight of b" in str(err)
    err = refused([a], [1.0], MergeOptions("cat"))
    assert err.code == "invalid_merge" and "at least two sources" in str(err)
    other_base = make_adapter("other", seed=6)[0]
    from tests.adapters.conftest import edit_config

    edit_config(other_base, base_model_name_or_path="someone/else")
    edit_config(a, base_model_name_or_path="ours")
    err = refused([a, other_base], [1.0, 1.0], MergeOptions("cat"))
    assert err.code == "merge_mismatch" and "different base models" in str(err)
