"""Thin DVC entry points: `python -m stages.<name> [VARIANT]`, one per stage in dvc.yaml."""
