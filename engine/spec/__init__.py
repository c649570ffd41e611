"""Tokens decided ahead of the model: speculative decoding (n-gram and draft-model proposers) and drafts."""
