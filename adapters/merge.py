"""Merging LoRA adapters into one: the combinations of peft's ``add_weighted_adapter`` computed on the adapters'
own tensors (float32, on the CPU), so a tenant can serve several adapters as one ordinary adapter.

Per (layer, module), with each source's weight ``w`` and scaling ``s`` (alpha / r, or alpha / sqrt(r)):
- ``cat``: A = [w1*s1*A1; w2*s2*A2; ...], B = [B1, B2, ...] (rank: the sum; exactly the weighted sum of deltas);
- ``linear`` / ``ties`` / ``dare_linear`` / ``dare_ties`` / ``magnitude_prune``: the A's and the B's are combined
  separately (equal ranks only), A's with sign(w*s)*sqrt(|w*s|), B's with sqrt(|w*s|) (peft's approximation:
  B'A' is not the weighted sum of the B_iA_i);
- ``svd``: the weighted sum of the deltas s_i*B_i@A_i, truncated to ``svd_rank`` by its SVD (B = U*S, A = Vh).
The merged adapter has lora_alpha = r (scaling 1), no rslora, no DoRA. DARE's random pruning draws from a torch
generator seeded with ``seed`` (recorded), module by module in the model's order, A's then B's, source by source:
the same draws peft makes after ``torch.manual_seed(seed)``, so the result is reproducible and checkable.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from .errors import AdapterError
from .files import CONFIG_NAME, WEIGHTS_NAME
from .loader import LoadedAdapter
from .spec import ALL_LORA_MODULES, BaseModelSpec

# Methods that combine A's and B's separately (equal ranks), and whether each takes a density / draws at random.
_FACTOR_METHODS = ("linear", "ties", "dare_linear", "dare_ties", "magnitude_prune")
MERGE_METHODS: tuple[str, ...] = ("cat", "svd", *_FACTOR_METHODS)
DENSITY_METHODS = frozenset({"ties", "dare_linear", "dare_ties", "magnitude_prune"})
RANDOM_METHODS = frozenset({"dare_linear", "dare_ties"})
SIGN_METHODS = ("total", "frequency")
MAX_WEIGHT = 1e4  # |weight| past this is refused (alpha-scaled deltas would overflow long before it matters)


@dataclass(frozen=True)
class MergeSource:
    adapter: LoadedAdapter  # checked and loaded (loraplex.adapters.load_adapter)
    weight: float
    label: str  # how refusals name it, e.g. "support-bot@2"


@dataclass(frozen=True)
class MergeOptions:
    method: str
    density: float | None = None  # ties, dare_*, magnitude_prune: the fraction of values kept, in (0, 1]
    svd_rank: int | None = None  # svd: the merged rank (default: the largest source rank)
    majority_sign_method: str = "total"  # ties, dare_ties
    seed: int | None = None  # dare_*: the generator's seed (drawn and recorded when None)


@dataclass
class MergedAdapter:
    config: dict[str, object]  # adapter_config.json
    tensors: dict[str, torch.Tensor]  # adapter_model.safetensors, peft's names
    rank: int
    seed: int | None = None  # the seed DARE's draws used (None: no random draws)
    modules: list[tuple[int, str]] = field(default_factory=list)

    def write(self, folder: Path) -> Path:
        """The merged adapter as a PEFT folder (config + safetensors)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(self.config, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in self.tensors.items()}, str(folder / WEIGHTS_NAME))
        return folder


def _refuse(message: str, code: str = "invalid_merge") -> AdapterError:
    return AdapterError(message, code=code)


def check_options(options: MergeOptions, n_sources: int) -> None:
    """Refuse a method, density, rank or sign method peft would not take (or would take and do nothing with)."""
    if options.method not in MERGE_METHODS:
        raise _refuse(
            f"unknown merge method {options.method!r}; choose one of {', '.join(MERGE_METHODS)}",
            code="unknown_merge_method",
        )
    if n_sources < 2:
        raise _refuse(f"a merge needs at least two sources, got {n_sources}")
    density = options.density
    if options.method in DENSITY_METHODS:
        if density is None:
            raise _refuse(f"merge method {options.method!r} needs a density in (0, 1]")
        if not (isinstance(density, (int, float)) and math.isfinite(density) and 0 < density <= 1):
            raise _refuse(f"density must be in (0, 1], got {density!r}")
    elif density is not None:
        raise _refuse(f"merge method {options.method!r} takes no density (only {', '.join(sorted(DENSITY_METHODS))})")
    if options.svd_rank is not None and (options.method != "svd" or options.svd_rank < 1):
        raise _refuse(f"svd_rank must be a positive integer and only goes with method 'svd', got {options.svd_rank}")
    if options.majority_sign_method not in SIGN_METHODS:
        raise _refuse(f"majority_sign_method must be one of {', '.join(SIGN_METHODS)}")
    if options.seed is not None and not (0 <= options.seed < 2**63):
        raise _refuse(f"seed must be in [0, 2**63), got {options.seed}")


def _check_sources(sources: list[MergeSource], options: MergeOptions) -> list[tuple[int, str]]:
    """The (layer, module) pairs every source targets (refusing DoRA, bad weights, mismatched targets, bases or
    ranks), in the model's order."""
    for s in sources:
        if not (math.isfinite(s.weight) and 0 < abs(s.weight) <= MAX_WEIGHT):
            raise _refuse(f"the weight of {s.label} must be a finite non-zero number of at most {MAX_WEIGHT:g} in size")
        if s.adapter.use_dora:
            raise _refuse(
                f"{s.label} is a DoRA adapter (use_dora); merging DoRA adapters is not supported", code="merge_dora"
            )
    first = sources[0]
    keys = set(first.adapter.weights)
    bases = {s.adapter.base_model_name_or_path for s in sources} - {None}
    if len(bases) > 1:
        raise _refuse(
            f"the sources were trained for different base models ({', '.join(sorted(str(b) for b in bases))})",
            code="merge_mismatch",
        )
    for s in sources[1:]:
        other = set(s.adapter.weights)
        if other != keys:
            only = sorted(other ^ keys)[0]
            raise _refuse(
                f"{first.label} and {s.label} target different modules (layer {only[0]} {only[1]} is in only one); "
                "merged sources must target the same modules",
                code="merge_mismatch",
            )
    order = sorted(keys, key=lambda lm: (lm[0], ALL_LORA_MODULES.index(lm[1])))
    if options.method in _FACTOR_METHODS:
        for layer, module in order:
            ranks = [s.adapter.weights[(layer, module)].a.shape[0] for s in sources]
            if len(set(ranks)) > 1:
                labels = ", ".join(f"{s.label} r={r}" for s, r in zip(sources, ranks, strict=True))
                raise _refuse(
                    f"method {options.method!r} needs equal ranks, but layer {layer} {module} has {labels}; "
                    "use 'cat' or 'svd'",
                    code="merge_rank_mismatch",
                )
    return order


def merge_adapters(sources: list[MergeSource], options: MergeOptions, base: BaseModelSpec) -> MergedAdapter:
    """The merged adapter of `sources` (checked: AdapterError naming the problem)."""
    check_options(options, len(sources))
    if base.fused:
        raise _refuse(f"merging is not supported on a {base.architecture} base (fused projections)", "merge_mismatch")
    order = _check_sources(sources, options)
    seed = None
    generator = None
    if options.method in RANDOM_METHODS and options.density is not None and options.density < 1:
        seed = options.seed if options.seed is not None else secrets.randbits(63)
        generator = torch.Generator().manual_seed(seed)
    factors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for key in order:
            weights = [s.adapter.weights[key] for s in sources]
            a_list = [w.a.float() for w in weights]
            b_list = [w.b.float() for w in weights]
            scaled = [s.weight * w.scaling for s, w in zip(sources, weights, strict=True)]
            if options.method == "cat":
                factors[key] = (
                    # (A * weight) * scaling, in peft's order of float32 products
                    torch.cat([a * s.weight * w.scaling for a, s, w in zip(a_list, sources, weights, strict=True)], 0),
                    torch.cat(b_list, 1),
                )
            elif options.method == "svd":
                factors[key] = _svd(a_list, b_list, scaled, options.svd_rank or max(a.shape[0] for a in a_list))
            else:
                signs = [1.0 if k >= 0 else -1.0 for k in scaled]
                w_a = [math.sqrt(abs(k)) * sg for k, sg in zip(scaled, signs, strict=True)]
                w_b = [math.sqrt(abs(k)) for k in scaled]
                factors[key] = (
                    _combine(a_list, w_a, options, generator),
                    _combine(b_list, w_b, options, generator),
                )
    rank = max(a.shape[0] for a, _ in factors.values())
    tensors: dict[str, torch.Tensor] = {}
    for (layer, module), (a, b) in factors.items():
        pad = rank - a.shape[0]  # modules of smaller rank: zero rows of A / columns of B change nothing
        if pad:
            a = torch.cat([a, a.new_zeros(pad, a.shape[1])], 0)
            b = torch.cat([b, b.new_zeros(b.shape[0], pad)], 1)
        prefix = f"base_model.model.model.layers.{layer}.{base.module_block(module)}.{module}"
        tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    config = _config(order, rank, base, sources)
    return MergedAdapter(config=config, tensors=tensors, rank=rank, seed=seed, modules=order)


def _svd(
    a_list: list[torch.Tensor], b_list: list[torch.Tensor], scaled: list[float], rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    delta = sum((k * (b @ a) for a, b, k in zip(a_list, b_list, scaled, strict=True)), torch.zeros(()))
    rank = min(rank, *delta.shape)
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    return vh[:rank].contiguous(), (u[:, :rank] * s[:rank]).contiguous()


def _prune_magnitude(t: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the int(density * size) largest values by magnitude (ties broken as torch.topk breaks them)."""
    if density >= 1:
        return t
    keep = torch.zeros(t.numel(), dtype=t.dtype)
    keep[torch.topk(t.abs().reshape(-1), k=int(density * t.numel()), largest=True).indices] = 1
    return t * keep.reshape(t.shape)


def _prune_random(t: torch.Tensor, density: float, generator: torch.Generator | None) -> torch.Tensor:
    """DARE: drop each value with probability 1 - density, rescale the rest by 1 / density."""
    if density >= 1:
        return t
    keep = torch.bernoulli(torch.full_like(t, density), generator=generator)
    return t * keep / density


def _combine(
    tensors: list[torch.Tensor], weights: list[float], options: MergeOptions, generator: torch.Generator | None
) -> torch.Tensor:
    method, density = options.method, options.density
    if method in ("ties", "magnitude_prune"):
        assert density is not None
        tensors = [_prune_magnitude(t, density) for t in tensors]
    elif method in RANDOM_METHODS:
        assert density is not None
        tensors = [_prune_random(t, density, generator) for t in tensors]
    stacked = torch.stack(tensors, 0)
    weighted = stacked * torch.tensor(weights, dtype=stacked.dtype).view(-1, *([1] * (stacked.dim() - 1)))
    if method not in ("ties", "dare_ties"):
        return weighted.sum(0)
    # TIES: per value, the sign with the larger total (or count) wins; the mean of the values of that sign
    votes = stacked.sum(0) if options.majority_sign_method == "total" else stacked.sign().sum(0)
    majority = torch.where(votes >= 0, 1.0, -1.0)
    agree = stacked.sign() == majority
    return (weighted * agree).sum(0) / agree.sum(0).clamp(min=1)


def _config(
    order: list[tuple[int, str]], rank: int, base: BaseModelSpec, sources: list[MergeSource]
) -> dict[str, object]:
    """adapter_config.json of the merged adapter: r = alpha (scaling 1), its modules named as plainly as they can
    be (short names when every layer has the same ones, else each module's full name)."""
    layers = sorted({layer for layer, _ in order})
    modules = [m for m in ALL_LORA_MODULES if any(m == mod for _, mod in order)]
    if len(order) == len(layers) * len(modules) and layers == list(range(base.num_hidden_layers)):
        targets: list[str] = modules
    else:
        targets = [f"model.layers.{layer}.{base.module_block(m)}.{m}" for layer, m in order]
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": sources[0].adapter.base_model_name_or_path,
        "r": rank,
        "lora_alpha": rank,
        "target_modules": targets,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }
