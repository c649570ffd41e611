"""From logits to tokens: sampling parameters, logits processing (penalties, bias, bans) and the sampler."""
