"""Quantized variants (stage quantize): recipes from params.yaml, llm-compressor's oneshot in one process or
several, and the GPUs a variant needs."""
