"""loraplex.engine: the serving core (model, paged KV cache, scheduler, sampler, engines)."""

import loraplex.envvars.openmp  # noqa: F401  # first: OpenMP's barrier waits, before torch loads libgomp
from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.config import EngineArgs
from loraplex.engine.core.share import Share
from loraplex.engine.errors import EngineError, ModelLoadError, RequestError
from loraplex.engine.llm import LLM
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.lora.ref import AdapterRef
from loraplex.engine.model.files import prepare_default_model
from loraplex.engine.outputs import FinishReason, RequestOutput, TokenLogprob
from loraplex.engine.probe import EngineProbe
from loraplex.engine.sample.sampling_params import SamplingParams
from loraplex.engine.stats import EngineStats

__all__ = [
    "LLM",
    "AdapterRef",
    "AsyncEngine",
    "EngineArgs",
    "EngineError",
    "EngineProbe",
    "EngineStats",
    "FinishReason",
    "LLMEngine",
    "ModelLoadError",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "Share",
    "TokenLogprob",
    "prepare_default_model",
]
