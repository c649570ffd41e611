"""stack_adapter's layout reproduces peft's LoRA delta for every module, with zero padding."""

from __future__ import annotations

import pytest
import torch

from loraplex.adapters import LORA_GROUPS, AdapterError, BaseModelSpec, load_adapter, stack_adapter

MAX_RANK = 8

VARIANTS = {
    "plain": dict(r=4, lora_alpha=8),
    "rslora": dict(r=4, lora_alpha=6, use_rslora=True),
    "patterns": dict(r=4, lora_alpha=8, rank_pattern={"k_proj": 2, "up_proj": 8}, alpha_pattern={"o_proj": 1.5}),
    "subset": dict(r=3, lora_alpha=5, target_modules=["k_proj", "up_proj", "o_proj"], layers_to_transform=[1]),
}


def _peft_delta(peft_model, layer: int, module: str, x: torch.Tensor) -> torch.Tensor:
    block = "self_attn" if module in LORA_GROUPS["qkv"] + LORA_GROUPS["o"] else "mlp"
    linear = getattr(getattr(peft_model.base_model.model.model.layers[layer], block), module)
    if not hasattr(linear, "base_layer"):  # not adapted
        return torch.zeros(x.shape[0], linear.out_features)
    return linear(x) - linear.base_layer(x)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stacked_layout_reproduces_peft_deltas(make_adapter, base: BaseModelSpec, variant: str) -> None:
    folder, peft_model = make_adapter(variant, **VARIANTS[variant])
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    stacked = stack_adapter(adapter, base, MAX_RANK, torch.float32, "cpu")
    assert {layer for layer, _ in stacked} == set(adapter.layers)
    torch.manual_seed(123)
    checked = 0
    with torch.no_grad():
        for (layer, group), (a, b) in stacked.items():
            modules = LORA_GROUPS[group]
            in_features = base.module_shape(modules[0])[0]
            outs = [base.module_shape(m)[1] for m in modules]
            assert a.shape == (len(modules), MAX_RANK, in_features) and b.shape == (sum(outs), MAX_RANK)
            x = torch.randn(5, in_features)
            row = 0
            for i, (module, out_features) in enumerate(zip(modules, outs)):
                got = (x @ a[i].T) @ b[row : row + out_features].T
                torch.testing.assert_close(got, _peft_delta(peft_model, layer, module, x), atol=1e-5, rtol=1e-4)
                row += out_features
                checked += (layer, module) in adapter.weights
    assert checked == len(adapter.weights)


def test_padding_is_zero_and_missing_modules_are_zero(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter("pad", **VARIANTS["subset"])
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    stacked = stack_adapter(adapter, base, MAX_RANK, torch.float32, "cpu")
    assert set(stacked) == {(1, g) for g in LORA_GROUPS}
    a, b = stacked[(1, "qkv")]
    q_out, k_out = base.module_shape("q_proj")[1], base.module_shape("k_proj")[1]
    assert a[0].abs().sum() == 0 and a[2].abs().sum() == 0  # no q / v LoRA
    assert a[1, 3:].abs().sum() == 0 and b[:, 3:].abs().sum() == 0  # rank 3 padded to 8
    assert b[:q_out].abs().sum() == 0 and b[q_out + k_out :].abs().sum() == 0
    assert b[q_out : q_out + k_out, :3].abs().sum() > 0
    down_a, down_b = stacked[(1, "down")]
    assert down_a.abs().sum() == 0 and down_b.abs().sum() == 0


def test_dtype_and_scaling_folded_into_b(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter("bf16", r=4, lora_alpha=12)
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    stacked = stack_adapter(adapter, base, 4, torch.bfloat16, torch.device("cpu"))
    a, b = stacked[(0, "o")]
    assert a.dtype == b.dtype == torch.bfloat16 and a.device.type == "cpu"
    w = adapter.weights[(0, "o_proj")]
    torch.testing.assert_close(b.float(), (w.b * 3.0).bfloat16().float())
    torch.testing.assert_close(a[0].float(), w.a.bfloat16().float())


def test_max_rank_below_adapter_rank_is_refused(make_adapter, base: BaseModelSpec) -> None:
    folder, _ = make_adapter("big", r=8)
    adapter = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    with pytest.raises(AdapterError, match="rank 8 exceeds max_rank 4"):
        stack_adapter(adapter, base, 4, torch.float32, "cpu")
