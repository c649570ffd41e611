"""POST /v1/adapters/{name}/merge on a started server: two uploaded adapters merged into a new version that records
its sources, is served, and answers as peft's merged adapter (add_weighted_adapter) does on the base; refusals by
name over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.platform.helpers import auth, create_tenant, error_of, stored_blobs, upload, zip_folder

PROMPT = [11, 22, 33, 44, 55, 66]
STEPS = 5


def merge(url: str, key: str, name: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/adapters/{name}/merge", json=body, headers=auth(key), timeout=120)


def completion(url: str, key: str, model: str) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": STEPS,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
    }
    r = httpx.post(f"{url}/v1/completions", headers=auth(key), json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def peft_merged(base_dir: Path, folders: list[Path], weights: list[float], **kwargs: Any) -> tuple[list[int], Any]:
    """peft's merged adapter on the base: its greedy tokens after PROMPT and the log-probabilities of each step."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(folders[0]), "s0")
    for i, folder in enumerate(folders[1:], 1):
        model.load_adapter(str(folder), adapter_name=f"s{i}")
    model.add_weighted_adapter([f"s{i}" for i in range(len(folders))], weights, "merged", **kwargs)
    model.set_adapter("merged")
    model.eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=STEPS, do_sample=False, eos_token_id=None)
        tokens = out[0, len(PROMPT) :].tolist()
        logits = model(out).logits[0, len(PROMPT) - 1 : -1]
    return tokens, torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("method", ["cat", "svd", "linear"])
def test_merge_of_two_uploads_serves_what_peft_merges(start_server, adapter_factory, tiny_llama_dir, method) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "mixer")
    targets = ("q_proj", "v_proj", "down_proj", "gate_proj")
    a = adapter_factory("merge-a", seed=31, targets=targets)
    b = adapter_factory("merge-b", seed=32, targets=targets)
    assert upload(server.url, key, "alpha", archive=zip_folder(a)).status_code == 201
    assert upload(server.url, key, "beta", archive=zip_folder(adapter_factory("merge-b0", seed=30, targets=targets)))
    assert upload(server.url, key, "beta", archive=zip_folder(b)).status_code == 201  # beta@2, current
    weights = [0.8, -0.6]
    r = merge(
        server.url,
        key,
        "mix",
        method=method,
        sources=[{"model": "alpha", "weight": 0.8}, {"model": "beta", "weight": -0.6}],
    )
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["version"] == 1 and made["name"] == "mix"
    assert made["origin"] == {
        "kind": "merge",
        "method": method,
        "sources": [{"name": "alpha", "version": 1, "weight": 0.8}, {"name": "beta", "version": 2, "weight": -0.6}],
    }
    assert made["publish_check"]["passed"] is True and made["publish_check"]["tokens_equal"] is True
    assert httpx.get(f"{server.url}/v1/adapters/mix@1", headers=auth(key)).json()["origin"] == made["origin"]

    tokens, logprobs = peft_merged(tiny_llama_dir, [a, b], weights, combination_type=method)
    choice = completion(server.url, key, "mix")
    served = choice["logprobs"]["token_logprobs"]
    from transformers import AutoTokenizer

    assert choice["text"] == AutoTokenizer.from_pretrained(tiny_llama_dir).decode(tokens)
    want = [float(logprobs[i, t]) for i, t in enumerate(tokens)]
    assert served == pytest.approx(want, abs=2e-3)
    # and it differs from either source served alone (the merge did something)
    assert completion(server.url, key, "alpha")["logprobs"]["token_logprobs"] != pytest.approx(want, abs=2e-3)


def test_merged_version_is_an_ordinary_adapter(start_server, adapter_factory) -> None:
    """A merge is the next version of its name: listed, rolled back, deleted like any; dare's seed is recorded."""
    server = start_server("sqlite")
    key = create_tenant(server.url, "versions")
    a, b = adapter_factory("merge-v1", seed=34), adapter_factory("merge-c", seed=33)
    for name, folder in (("one", a), ("two", b), ("both", a)):
        assert upload(server.url, key, name, archive=zip_folder(folder)).status_code == 201
    r = merge(
        server.url,
        key,
        "both",
        method="dare_linear",
        density=0.5,
        sources=[{"model": "one@1", "weight": 1.0}, {"model": "two", "weight": 1.0}],
    )
    assert r.status_code == 201, r.text
    seed = r.json()["origin"]["seed"]
    assert r.json()["version"] == 2 and isinstance(seed, int) and r.json()["origin"]["density"] == 0.5
    again = merge(
        server.url,
        key,
        "both",
        method="dare_linear",
        density=0.5,
        seed=seed,
        sources=[{"model": "one@1", "weight": 1.0}, {"model": "two", "weight": 1.0}],
    )
    assert again.status_code == 201 and again.json()["sha256"] == r.json()["sha256"]  # the same seed, the same weights
    versions = httpx.get(f"{server.url}/v1/adapters/both/versions", headers=auth(key)).json()
    assert [v["version"] for v in versions["data"]] == [1, 2, 3] and versions["current"] == 3
    back = httpx.put(f"{server.url}/v1/adapters/both/current", json={"version": 1}, headers=auth(key))
    assert back.status_code == 200 and back.json()["origin"] == {"kind": "upload"}
    endpoint = {"name": "mixbot", "adapter": "both@2"}
    assert httpx.post(f"{server.url}/v1/endpoints", json=endpoint, headers=auth(key)).status_code == 201
    assert completion(server.url, key, "mixbot") == completion(server.url, key, "both@2")
    assert httpx.delete(f"{server.url}/v1/adapters/both@2", headers=auth(key)).status_code == 409  # served
    assert httpx.delete(f"{server.url}/v1/endpoints/mixbot", headers=auth(key)).status_code == 200
    assert httpx.delete(f"{server.url}/v1/adapters/both@2", headers=auth(key)).status_code == 200


def test_merge_refusals_name_the_problem(start_server, adapter_factory) -> None:
    server = start_server("sqlite")
    key = create_tenant(server.url, "refused")
    other = create_tenant(server.url, "someone-else")
    assert upload(server.url, key, "r4", archive=zip_folder(adapter_factory("merge-r4", seed=35))).status_code == 201
    assert upload(server.url, key, "r8", archive=zip_folder(adapter_factory("merge-r8", r=8))).status_code == 201
    dora = adapter_factory("merge-dora", seed=5, lora_overrides={"use_dora": True}, magnitude_noise=0.3)
    assert upload(server.url, key, "dora", archive=zip_folder(dora)).status_code == 201
    qv = adapter_factory("merge-qv", targets=("q_proj", "v_proj"))
    assert upload(server.url, key, "qv", archive=zip_folder(qv)).status_code == 201
    assert (
        upload(server.url, other, "theirs", archive=zip_folder(adapter_factory("merge-c", seed=33))).status_code == 201
    )
    blobs = stored_blobs(server.settings.data_dir)

    def refused(status: int, code: str, words: str, **body: Any) -> None:
        r = merge(server.url, key, "out", **body)
        assert r.status_code == status, r.text
        error = error_of(r)
        assert error["code"] == code and words in error["message"], error

    two = [{"model": "r4"}, {"model": "r8"}]
    refused(400, "unknown_merge_method", "unknown merge method 'mean'", method="mean", sources=two)
    refused(400, "merge_rank_mismatch", "r4@1 r=4, r8@1 r=8", method="linear", sources=two)
    refused(400, "invalid_merge", "density must be in (0, 1]", method="dare_linear", density=1.5, sources=two)
    refused(400, "invalid_merge", "needs a density", method="ties", sources=two)
    refused(400, "merge_dora", "dora@1 is a DoRA adapter", method="cat", sources=[{"model": "r4"}, {"model": "dora"}])
    refused(400, "merge_mismatch", "target different modules", method="cat", sources=[{"model": "r4"}, {"model": "qv"}])
    bad_weight = [{"model": "r4", "weight": 0.0}, {"model": "r8"}]
    refused(400, "invalid_merge", "the weight of r4@1", method="cat", sources=bad_weight)
    refused(404, "adapter_not_found", "'theirs'", method="cat", sources=[{"model": "r4"}, {"model": "theirs"}])
    refused(404, "adapter_not_found", "'r4@7'", method="cat", sources=[{"model": "r4@7"}, {"model": "r8"}])
    r = merge(server.url, key, "out", method="cat", sources=[{"model": "r4"}])  # one source: the schema refuses
    assert r.status_code == 400 and "sources" in error_of(r)["message"]
    assert stored_blobs(server.settings.data_dir) == blobs  # nothing stored by any refusal
    assert httpx.get(f"{server.url}/v1/adapters/out", headers=auth(key)).status_code == 404
