"""SGLang-compatible engine simulator for GPU-less tests."""
