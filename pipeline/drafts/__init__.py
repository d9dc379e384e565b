"""Speculative methods and what each trains (stages distill, draft_finetune, eagle3, draft_quantize)."""
