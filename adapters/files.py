"""The file names of a PEFT adapter folder, and the suffixes of pickled checkpoints (never loaded)."""

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
