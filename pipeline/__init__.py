"""modelprep: the library behind the DVC stages in stages/, one subpackage per step of the pipeline
(README: Code layout)."""
