"""params.yaml: loaded and checked as a whole (every step's knobs) before any stage works, and overlaid
with named profiles."""
