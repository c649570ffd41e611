"""loraplex.kernels."""
