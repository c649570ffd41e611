"""loraplex.engine: the serving core (model, paged KV cache, scheduler, sampler, engines)."""
from loraplex.engine.adapter_ref import AdapterRef
from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.config import EngineArgs
from loraplex.engine.llm import LLM
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.model_files import ModelLoadError, prepare_default_model
from loraplex.engine.outputs import RequestOutput, TokenLogprob
from loraplex.engine.sampling_params import RequestError, SamplingParams

__all__ = ["AdapterRef", "AsyncEngine", "EngineArgs", "LLM", "LLMEngine", "ModelLoadError", "RequestError", "RequestOutput",
           "SamplingParams", "TokenLogprob", "prepare_default_model"]
