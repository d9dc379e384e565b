"""modelprep: the library behind the DVC stages in stages/ (one module or subpackage per concern)."""
