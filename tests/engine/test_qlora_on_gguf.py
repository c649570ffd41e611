"""A QLoRA-trained adapter served on the quantized base (issue 39).

QLoRA trains LoRA factors against a frozen base whose Linear weights are 4-bit: every forward pass uses the base
weights de-quantized. Here the 4-bit base is the bundled SmolLM2 GGUF's own Q4_1 projections (and its Q8_0
embedding/LM head), de-quantized: exactly the float32 checkpoint converted from the file. peft LoRA on that base
takes a few real AdamW steps on a short text (the adapter's weights come from the optimizer, not from a random
init), is saved, and is served by the engine on ``--quantization gguf`` (the file's blocks, never de-quantized):
its logits must equal peft's on the de-quantized base within the float tolerance, with the same greedy tokens, in
one batch with a base request.
"""

from __future__ import annotations

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from tests.engine.helpers import SMOLLM2_LOGITS_ATOL, LogitsRecorder, run_to_completion
from tests.engine.test_quantized_weights import chat_ids
from tests.lora.helpers import load_hf

pytestmark = pytest.mark.slow

TEXT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Bonjour! The capital of France is Paris, on the Seine. Bonjour!"},
]
PROMPTS = ["What is the capital of France?", "Name a river in Europe."]


@torch.inference_mode()
def greedy(model, prompt: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """peft's first-position logits and its n most likely tokens in turn (EOS or not)."""
    ids, first = list(prompt), None
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        first = logits if first is None else first
        ids.append(int(logits.argmax()))
    assert first is not None
    return first, ids[len(prompt) :]


def test_a_qlora_trained_adapter_on_the_gguf_blocks_equals_peft_on_the_dequantized_base(smol_dir, tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    engine = LLMEngine(model=None, quantization="gguf", max_num_seqs=4, num_kv_blocks=120, max_num_batched_tokens=256)
    base = load_hf(smol_dir)
    # the base the adapter trains on is the engine's Q4_1 blocks de-quantized, bit for bit
    served = engine.runner.model.layers[3].down
    assert [p.qtype for p in served.parts] == ["Q4_1"]
    assert torch.equal(served.parts[0].dequantize(), base.model.layers[3].mlp.down_proj.weight.detach())

    tok = engine.tokenizer
    text = tok.apply_chat_template(TEXT, tokenize=True)
    ids = torch.tensor([list(text["input_ids"] if hasattr(text, "keys") else text)])
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    model.train()
    losses = []
    for _ in range(4):  # QLoRA's loop: the base frozen, only the LoRA factors step
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    model.eval()
    assert losses[-1] < losses[0], losses
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert all(float(b.abs().max()) > 0 for b in lora_b)  # B starts at zero: the optimizer moved every one
    model.save_pretrained(tmp_path / "qlora")

    prompts = [chat_ids(tok, text) for text in PROMPTS]
    ref = engine.add_adapter(str(tmp_path / "qlora"))
    rec = LogitsRecorder()
    engine.probe = EngineProbe(on_logits=rec)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    jobs = [(prompts[0], params, "a0", ref), (prompts[1], params, "a1", ref), (prompts[0], params, "base", None)]
    done = run_to_completion(engine, {0: jobs})
    for i, prompt in enumerate(prompts):
        logits, tokens = greedy(model, prompt, 8)
        torch.testing.assert_close(rec.first[f"a{i}"], logits, atol=SMOLLM2_LOGITS_ATOL, rtol=0)
        assert done[f"a{i}"].token_ids == tokens, PROMPTS[i]
    with model.disable_adapter():
        base_logits, base_tokens = greedy(model, prompts[0], 8)
    torch.testing.assert_close(rec.first["base"], base_logits, atol=SMOLLM2_LOGITS_ATOL, rtol=0)
    assert done["base"].token_ids == base_tokens
    assert (rec.first["a0"] - rec.first["base"]).abs().max() > 100 * SMOLLM2_LOGITS_ATOL  # the adapter shows
