"""The native model and what runs it: the model's shape read from config.json, its families, layers (llama,
linear, rotary), its files (safetensors, GGUF) and the runner that owns the weights, the KV cache and the
compute backend."""
