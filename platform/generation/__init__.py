"""Generation: running the engine requests behind one API call (`run`: choices, metrics, aborts), the
orchestration both the OpenAI routes and the Batch API go through (`service`: model resolution, defaults,
translation, admission, shadow copies) and token texts for logprobs."""
