"""Evaluation (stages evaluate, evaluate_draft, functional_baseline): fidelity to the target, lm-eval, speculative
acceptance, the served speed it predicts from measured cost profiles, and vLLM's own measurement."""
