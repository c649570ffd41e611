"""Every refusal of load_adapter, each with a crafted bad adapter and a check of the message."""

from __future__ import annotations

import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from peft import IA3Config, get_peft_model
from transformers import LlamaForCausalLM

from loraplex.adapters import AdapterError, AdapterLimits, BaseModelSpec, inspect_adapter, load_adapter

MAX_RANK = 8
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def refused(
    source, base: BaseModelSpec, code: str, *fragments: str, limits: AdapterLimits = AdapterLimits()
) -> AdapterError:
    """Assert that both load_adapter and inspect_adapter refuse ``source`` with ``code`` and the fragments."""
    for fn in (load_adapter, inspect_adapter):
        with pytest.raises(AdapterError) as info:
            fn(source, base, max_lora_rank=MAX_RANK, limits=limits)
        err = info.value
        assert err.code == code, str(err)
        for fragment in fragments:
            assert fragment in str(err), f"{fragment!r} not in {str(err)!r}"
    return err


class _Bomb:
    """A pickle that creates a marker file if anything ever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# --- pickled weights --------------------------------------------------------------------------


def test_pickled_adapter_model_bin_is_never_unpickled(adapter_dir: Path, base, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    (adapter_dir / "adapter_model.safetensors").unlink()
    (adapter_dir / "adapter_model.bin").write_bytes(pickle.dumps(_Bomb(marker)))
    refused(adapter_dir, base, "pickled_weights", "adapter_model.bin", "never loaded")
    assert not marker.exists()


@pytest.mark.parametrize("name", ["training_args.bin", "optimizer.pt", "weights.pth", "state.pkl"])
def test_any_pickle_next_to_the_adapter_is_refused(adapter_dir: Path, base, tmp_path: Path, zip_folder, name) -> None:
    (adapter_dir / name).write_bytes(pickle.dumps(_Bomb(tmp_path / "unpickled")))
    refused(adapter_dir, base, "pickled_weights", name)
    refused(zip_folder(adapter_dir, tmp_path / "up.zip", inside="x"), base, "pickled_weights", name)
    assert not (tmp_path / "unpickled").exists()


def test_a_bare_pickle_file_as_source_is_refused(base, tmp_path: Path) -> None:
    path = tmp_path / "adapter.pt"
    torch.save({"w": torch.zeros(2)}, path)
    refused(path, base, "pickled_weights", "adapter.pt")


# --- config-level refusals --------------------------------------------------------------------


def test_modules_to_save_is_refused(make_adapter, base) -> None:
    folder, _ = make_adapter("mts", target_modules=["q_proj"], modules_to_save=["lm_head"])
    refused(folder, base, "modules_to_save", "modules_to_save", "lm_head")


def test_dora_is_accepted_and_what_it_cannot_be_is_refused(make_adapter, base, edit_config, edit_tensors) -> None:
    """DoRA is served (tests/lora/test_lora_dora.py); refused by name: magnitudes without use_dora, use_dora
    without magnitudes or with wrongly shaped ones, DoRA with megatron_config (peft refuses it) and DoRA on the
    embeddings (like any LoRA there)."""
    folder, _ = make_adapter("dora", target_modules=["q_proj", "v_proj"], use_dora=True)
    info = inspect_adapter(folder, base, max_lora_rank=MAX_RANK)
    assert info.use_dora and info.target_modules == ["q_proj", "v_proj"]
    loaded = load_adapter(folder, base, max_lora_rank=MAX_RANK)
    q = loaded.weights[(0, "q_proj")]
    assert q.magnitude is not None and q.magnitude.shape == (q.b.shape[0],)
    edit_config(folder, megatron_config={"tensor_model_parallel_size": 1})
    refused(folder, base, "dora", "DoRA", "megatron_config")
    edit_config(folder, megatron_config=None, use_dora=False)  # the magnitude vectors in the file give it away
    refused(folder, base, "dora", "DoRA", "lora_magnitude_vector", "use_dora")
    edit_config(folder, use_dora="yes")
    refused(folder, base, "invalid_config", "use_dora must be true or false")
    edit_config(folder, use_dora=True)
    magnitude = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"
    edit_tensors(folder, lambda t: {**t, magnitude: t[magnitude][:-1]})
    refused(folder, base, "bad_shape", "layers.0.q_proj", "lora_magnitude_vector")
    edit_tensors(folder, lambda t: {k: v for k, v in t.items() if k != magnitude})
    refused(folder, base, "missing_weights", "layers.0.q_proj has no lora_magnitude_vector")
    emb, _ = make_adapter("dora-emb", target_modules=["q_proj", "embed_tokens"], use_dora=True)
    refused(emb, base, "embedding_lora", "LoRA on embed_tokens")


@pytest.mark.parametrize("module", ["embed_tokens", "lm_head"])
def test_lora_on_embeddings_or_lm_head_is_refused(make_adapter, base, module: str) -> None:
    folder, _ = make_adapter(f"emb-{module}", target_modules=["q_proj", module])
    refused(folder, base, "embedding_lora", f"LoRA on {module} is not supported")


def test_lora_embedding_tensors_are_refused_even_if_config_hides_them(
    make_adapter, base, edit_config, edit_tensors
) -> None:
    folder, _ = make_adapter("emb-hidden", target_modules=["q_proj", "embed_tokens"])
    edit_config(folder, target_modules=["q_proj"])
    refused(folder, base, "embedding_lora", "LoRA on embed_tokens", "embed_tokens.base_layer")
    edit_tensors(folder, lambda t: {k: v for k, v in t.items() if "base_layer" not in k})
    refused(folder, base, "embedding_lora", "LoRA on embed_tokens", "lora_embedding")


def test_trainable_token_indices_are_refused(make_adapter, base) -> None:
    folder, _ = make_adapter("tokens", target_modules=["q_proj"], trainable_token_indices=[3, 5])
    refused(folder, base, "added_tokens", "trainable_token_indices")


def test_embedding_weights_in_the_file_are_refused(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {**t, "base_model.model.model.embed_tokens.weight": torch.zeros(130, 48)})
    refused(adapter_dir, base, "added_tokens", "embed_tokens.weight", "resized embeddings")


def test_added_tokens_via_trainable_tokens_tensor_are_refused(adapter_dir, base, edit_tensors) -> None:
    name = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"
    edit_tensors(adapter_dir, lambda t: {**t, name: torch.zeros(2, 48)})
    refused(adapter_dir, base, "added_tokens", "trainable_tokens_delta")


@pytest.mark.parametrize(
    "targets, fragment",
    [
        (["q_proj", "c_attn"], "'c_attn'"),
        (["q_proj", "input_layernorm"], "input_layernorm"),
        (r".*\.mlp", "model.layers.0.mlp"),
        (r".*\.nothing_here", "matches no projection"),
    ],
)
def test_unknown_target_modules_are_refused(adapter_dir, base, edit_config, targets, fragment) -> None:
    edit_config(adapter_dir, target_modules=targets)
    refused(adapter_dir, base, "unknown_target_module", "unknown target module", fragment)


def test_unknown_module_tensor_names_are_refused(adapter_dir, base, edit_tensors) -> None:
    def rename(t):
        t = dict(t)
        t["base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight"] = t.pop(Q_A)
        return t

    edit_tensors(adapter_dir, rename)
    refused(adapter_dir, base, "unknown_target_module", "qkv_proj")


def test_non_lora_peft_types_are_refused(tiny_config, base, tmp_path: Path, edit_config, adapter_dir) -> None:
    model = LlamaForCausalLM(tiny_config)
    ia3 = get_peft_model(model, IA3Config(target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]))
    ia3.save_pretrained(tmp_path / "ia3")
    refused(tmp_path / "ia3", base, "unsupported_peft_type", "'IA3'", "only LoRA")
    edit_config(adapter_dir, peft_type="LOHA")
    refused(adapter_dir, base, "unsupported_peft_type", "'LOHA'")


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"lora_bias": True}, "lora_bias"),
        ({"task_type": "SEQ_CLS"}, "SEQ_CLS"),
        ({"init_lora_weights": "pissa"}, "pissa"),
        ({"layer_replication": [[0, 2]]}, "layer_replication"),
        ({"some_future_variant": {"on": True}}, "some_future_variant"),
    ],
)
def test_unsupported_options_are_refused(adapter_dir, base, edit_config, changes, fragment) -> None:
    edit_config(adapter_dir, **changes)
    refused(adapter_dir, base, "unsupported_option", fragment)


def test_lora_bias_tensors_are_refused(make_adapter, base, edit_config) -> None:
    folder, _ = make_adapter("bias", target_modules=["q_proj"], lora_bias=True)
    edit_config(folder, lora_bias=False)
    refused(folder, base, "unsupported_option", "LoRA bias", "lora_B.bias")


# --- invalid or missing files -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "not valid JSON"),
        ('["LORA"]', "JSON object"),
        ('{"peft_type": "LORA", "r": -1, "target_modules": ["q_proj"]}', "r must be a positive integer"),
        ('{"peft_type": "LORA", "r": 4, "lora_alpha": 8}', "target_modules is missing"),
        ('{"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"], "rank_pattern": {"q_proj": 0}}', "rank_pattern"),
    ],
)
def test_invalid_config_is_refused(adapter_dir, base, text: str, fragment: str) -> None:
    (adapter_dir / "adapter_config.json").write_text(text)
    refused(adapter_dir, base, "invalid_config", fragment)


def test_pathological_regex_is_refused_quickly(adapter_dir, base, edit_config) -> None:
    edit_config(adapter_dir, target_modules=r"(?:(?:.|\w)*)*[A-Z]")
    refused(adapter_dir, base, "invalid_config", "takes too long")
    edit_config(adapter_dir, target_modules=r"(q_proj")
    refused(adapter_dir, base, "invalid_config", "not a valid regular expression")


def test_oversized_config_is_refused(adapter_dir, base, edit_config) -> None:
    edit_config(adapter_dir, revision="x" * 5000)
    refused(adapter_dir, base, "invalid_config", "over the limit", limits=AdapterLimits(max_config_bytes=4096))


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_missing_files_are_refused(adapter_dir, base, name: str) -> None:
    (adapter_dir / name).unlink()
    refused(adapter_dir, base, "missing_file", f"missing {name}")


def test_missing_source_and_archive_without_config(adapter_dir, base, tmp_path: Path) -> None:
    refused(tmp_path / "nope", base, "missing_file", "does not exist")
    archive = tmp_path / "weights-only.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(adapter_dir / "adapter_model.safetensors", "adapter_model.safetensors")
    refused(archive, base, "missing_file", "missing adapter_config.json")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    refused(other, base, "unsupported_archive", "neither an adapter folder")


# --- wrong base model -------------------------------------------------------------------------


def test_adapter_for_a_different_hidden_size_is_a_wrong_base_model(
    make_adapter, base, edit_config, tiny_llama_config
) -> None:
    other = tiny_llama_config(hidden_size=64, head_dim=16)
    folder, _ = make_adapter("other", config=other)
    edit_config(folder, base_model_name_or_path="acme/other-model")
    refused(folder, base, "wrong_base_model", "wrong base model", "hidden size 48", "acme/other-model")


def test_adapter_for_a_deeper_model_is_a_wrong_base_model(make_adapter, base, tiny_llama_config) -> None:
    folder, _ = make_adapter("deep", config=tiny_llama_config(num_hidden_layers=5), target_modules=["q_proj"])
    refused(folder, base, "wrong_base_model", "layer 3", "3 layers")
    folder, _ = make_adapter(
        "deep-subset", config=tiny_llama_config(num_hidden_layers=5), target_modules=["q_proj"], layers_to_transform=[4]
    )
    refused(folder, base, "wrong_base_model", "layers_to_transform names layer 4")


def test_adapter_for_another_architecture_is_a_wrong_base_model(adapter_dir, base, edit_config) -> None:
    edit_config(adapter_dir, auto_mapping={"base_model_class": "GPT2LMHeadModel", "parent_library": "x"})
    refused(adapter_dir, base, "wrong_base_model", "GPT2LMHeadModel", "LlamaForCausalLM")


# --- tensor checks ----------------------------------------------------------------------------


def test_rank_over_the_server_limit_is_refused(make_adapter, base) -> None:
    folder, _ = make_adapter("r16", r=16, target_modules=["v_proj"])
    refused(folder, base, "rank_too_large", "rank 16", "max_lora_rank of 8")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_values_are_refused(adapter_dir, base, edit_tensors, value: float) -> None:
    def poison(t):
        b = t[Q_B].clone()
        b[3, 1] = value
        return {**t, Q_B: b}

    edit_tensors(adapter_dir, poison)
    refused(adapter_dir, base, "non_finite", "layers.0.q_proj.lora_B", "NaN or Inf")


def test_huge_finite_values_are_not_mistaken_for_inf(adapter_dir, base, edit_tensors) -> None:
    """Finite values whose sum overflows are not called NaN / Inf: they are refused for their gain instead
    (3e38 times the scale overflows float32 the moment the engine folds the scale in)."""

    def huge(t):
        b = t[Q_B].clone()
        b[0, 0] = b[1, 0] = 3e38  # finite in float32, their sum is not
        return {**t, Q_B: b}

    edit_tensors(adapter_dir, huge)
    refused(adapter_dir, base, "scale_too_large", "layers.0.q_proj", "max|B| 3e+38", "bound of 2^32")


def test_every_a_needs_its_b(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {k: v for k, v in t.items() if k != Q_B})
    refused(adapter_dir, base, "unpaired_weights", "layers.0.q_proj has no lora_B")


def test_ranks_of_a_and_b_must_agree(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {**t, Q_B: t[Q_B][:, :2]})
    refused(adapter_dir, base, "bad_shape", "disagree on the rank")


def test_rank_must_match_the_config(adapter_dir, base, edit_config) -> None:
    edit_config(adapter_dir, rank_pattern={"k_proj": 2})
    refused(adapter_dir, base, "bad_shape", "rank 4", "says 2")


def test_weights_for_untargeted_modules_are_refused(adapter_dir, base, edit_config) -> None:
    edit_config(adapter_dir, layers_to_transform=[0, 1])
    refused(adapter_dir, base, "unexpected_tensor", "layers.2.")


def test_targeted_modules_without_weights_are_refused(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {k: v for k, v in t.items() if ".layers.1." not in k})
    refused(adapter_dir, base, "missing_weights", "layers.1.", "no weights")


def test_stray_tensors_are_refused(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {**t, "base_model.model.model.norm.weight": torch.ones(48)})
    refused(adapter_dir, base, "unexpected_tensor", "model.norm.weight")


def test_wrong_dtype_is_refused(adapter_dir, base, edit_tensors) -> None:
    edit_tensors(adapter_dir, lambda t: {**t, Q_A: t[Q_A].double()})
    refused(adapter_dir, base, "unsupported_dtype", "'F64'")


def test_refusal_is_a_value_error(adapter_dir, base) -> None:
    shutil.rmtree(adapter_dir)
    with pytest.raises(ValueError):
        load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
