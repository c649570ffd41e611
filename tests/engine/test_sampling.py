"""Sampler and output processing: greedy equivalences, stop strings and ids, logprobs, detokenisation."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from loraplex.engine import EngineProbe, LLMEngine, SamplingParams
from loraplex.engine.detokenizer import IncrementalDetokenizer
from tests.engine.helpers import HFOracle, run_to_completion

PROMPT = [412, 9013, 77, 2044, 318, 5001, 12, 880]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLMEngine(model=str(tiny_llama_dir), num_kv_blocks=128, block_size=8)


def generate(engine, params: SamplingParams, prompt=PROMPT):
    return run_to_completion(engine, {0: [(prompt, params, "x")]})["x"]


def test_top_k_1_and_tiny_top_p_equal_greedy(engine):
    greedy = generate(engine, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)).token_ids
    assert (
        generate(engine, SamplingParams(max_tokens=10, temperature=1.0, top_k=1, ignore_eos=True)).token_ids == greedy
    )
    assert (
        generate(engine, SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6, ignore_eos=True)).token_ids
        == greedy
    )
    assert (
        generate(engine, SamplingParams(max_tokens=10, temperature=1.0, min_p=1.0, ignore_eos=True)).token_ids == greedy
    )


def test_top_k_restricts_to_the_k_most_likely(engine):
    seen = set()
    first_logits = {}
    engine.probe = EngineProbe(on_logits=lambda ids, pos, logits: first_logits.setdefault("l", logits[0].clone()))
    for seed in range(30):
        out = generate(engine, SamplingParams(max_tokens=1, temperature=5.0, top_k=3, seed=seed))
        seen.add(out.token_ids[0])
    engine.probe = None
    top3 = set(first_logits["l"].topk(3).indices.tolist())
    assert seen <= top3 and len(seen) >= 2


def test_stop_string_is_cut_and_never_streamed(engine):
    base = generate(engine, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    text = base.text
    assert len(text) > 10
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    engine.add_request(PROMPT, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop]), "s")
    streamed = ""
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            streamed += out.new_text
            final = out
    assert final.finish_reason == "stop"
    assert final.text == text[: text.index(stop)]
    assert streamed == final.text and stop not in streamed


def test_stop_token_ids_and_max_tokens(engine):
    base = generate(engine, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    assert base.finish_reason == "length" and len(base.token_ids) == 12
    target = base.token_ids[5]
    stopped = generate(engine, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[target]))
    first = base.token_ids.index(target)
    assert stopped.finish_reason == "stop" and stopped.token_ids == base.token_ids[: first + 1]


def test_logprobs_are_consistent(engine):
    captured = []
    engine.probe = EngineProbe(on_logits=lambda ids, pos, logits: captured.append(logits[0].clone()))
    out = generate(engine, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=4))
    engine.probe = None
    assert len(out.logprobs) == 5
    for lp, logits in zip(out.logprobs, captured):
        ref = torch.log_softmax(logits, -1)
        assert math.isclose(lp.logprob, ref[lp.token_id].item(), abs_tol=1e-5)
        assert [t for t, _, _ in lp.top] == ref.topk(4).indices.tolist()
        assert lp.top[0][0] == lp.token_id  # greedy picks the most likely
        assert all(a[2] >= b[2] for a, b in zip(lp.top, lp.top[1:]))


def test_seed_reproducible_and_temperature_changes_output(engine):
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=123, ignore_eos=True)
    a = generate(engine, p).token_ids
    b = generate(engine, SamplingParams(max_tokens=10, temperature=1.0, seed=123, ignore_eos=True)).token_ids
    assert a == b
    # Same seed, other temperatures: the draws differ (the distributions themselves are checked against the
    # softmax in test_sampling_distributions).
    hot = generate(engine, SamplingParams(max_tokens=10, temperature=4.0, seed=123, ignore_eos=True)).token_ids
    greedy = generate(engine, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)).token_ids
    assert hot != a and greedy != a


@pytest.fixture(scope="module")
def eos_first(tiny_llama_dir, tmp_path_factory):
    """The tiny model with its EOS id set to the token that greedy decoding of PROMPT picks first (found with
    transformers, the oracle): EOS is then the most likely token at the first output position."""
    oracle = HFOracle(tiny_llama_dir)
    eos = oracle.greedy(PROMPT, 1)[0]
    model_dir = tmp_path_factory.mktemp("eos-first")
    for f in tiny_llama_dir.iterdir():
        shutil.copy(f, model_dir / f.name)
    config = json.loads((model_dir / "config.json").read_text())
    config["eos_token_id"] = eos
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir, eos, oracle


def test_min_tokens_suppresses_eos(eos_first):
    model_dir, eos, oracle = eos_first
    engine = LLMEngine(model=str(model_dir), num_kv_blocks=64, block_size=8)
    free = generate(engine, SamplingParams(max_tokens=8, temperature=0.0))
    assert free.token_ids == [eos] and free.finish_reason == "stop"  # EOS is the most likely first token
    held = generate(engine, SamplingParams(max_tokens=8, min_tokens=4, temperature=0.0))
    assert eos not in held.token_ids[:4]
    stops = sorted(engine.eos_token_ids)  # the config's EOS and the tokenizer's
    assert held.token_ids == oracle.greedy(PROMPT, 8, eos=stops, min_new_tokens=4)


def test_detokenizer_never_splits_multibyte_characters(smol_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smol_dir))
    text = "naïve café — 日本語のテキスト ✓ 🎉 done"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, stop=[])
    pieces = []
    for t in ids:
        d.add(t)
        piece = d.release(final=False)
        assert "\ufffd" not in piece
        pieces.append(piece)
    pieces.append(d.release(final=True))
    assert "".join(pieces) == tok.decode(ids)


def test_detokenizer_holds_back_possible_stop_prefix(smol_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smol_dir))
    d = IncrementalDetokenizer(tok, stop=["END!"])
    streamed = ""
    for t in tok.encode("alpha beta EN", add_special_tokens=False):
        d.add(t)
        streamed += d.release(final=False)
    assert not streamed.endswith("EN")  # could still become END!
    for t in tok.encode("D! tail", add_special_tokens=False):
        d.add(t)
        streamed += d.release(final=False)
    assert d.stopped and d.text == "alpha beta " and streamed + d.release(final=True) == "alpha beta "


class _RejectSome:
    """A TokenCheck that rejects a fixed set of tokens on the checked rows."""

    def __init__(self, rows: list[int], rejected: set[int], fallback: int) -> None:
        self.rows, self.rejected, self._fallback, self.asked = rows, rejected, fallback, []

    def fits(self, row: int, token: int) -> bool:
        self.asked.append((row, token))
        return token not in self.rejected

    def fallback(self, row: int) -> int:
        return self._fallback


def test_token_check_takes_the_runner_up_of_the_same_draw():
    from loraplex.engine.sample.sampler import Sampler

    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(temperature=1.0, seed=8),
    ]

    def draw(check=None):
        gens = [None] + [torch.Generator().manual_seed(p.seed) for p in params[1:]]
        return sampler(logits, params, gens, check).token_ids

    free = draw()
    first = draw(_RejectSome([0, 1], {free[0], free[1]}, fallback=-1))
    assert first[2] == free[2]  # unchecked row: untouched
    assert first[0] == logits[0].topk(2).indices[1].item()  # greedy row: the second-best logit
    assert first[1] not in (free[1], -1)
    again = draw(_RejectSome([0, 1], {free[0], free[1]}, fallback=-1))
    assert again == first  # the runner-up comes from the row's own seeded draw: reproducible


def test_token_check_falls_back_when_no_candidate_fits():
    from loraplex.engine.sample.sampler import Sampler

    logits = torch.full((1, 20), float("-inf"))
    logits[0, [3, 4]] = 0.0  # two allowed tokens, both rejected
    check = _RejectSome([0], {3, 4}, fallback=11)
    out = Sampler(torch.device("cpu"))(
        logits, [SamplingParams(temperature=1.0, seed=1)], [torch.Generator().manual_seed(1)], check
    )
    assert out.token_ids == [11]
    assert {t for _, t in check.asked} == {3, 4}  # masked tokens are never offered
