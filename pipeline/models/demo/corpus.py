"""Generic text for the GPU demo profile: docstrings of the running Python's installed code.

The CPU demo's generic prose is a few templated sentences, too few words for a 32k-token BPE
vocabulary. A real-sized demo needs real text, and nothing may be downloaded: the docstrings of the
standard library, then of the installed packages, are English prose with a technical vocabulary on
every machine that runs the pipeline. Deterministic for a given environment (the standard library
first, then site-packages, files in sorted order, the first `max_chars` characters).
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

from pipeline.core.errors import PipelineError

GENERAL_CORPORA = ("synthetic", "python-docs")  # demo.general_corpus: templated sentences, or these docstrings

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}


def python_files(roots: list[Path]):
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if not SKIP_DIRS & set(path.relative_to(root).parts[:-1]):
                yield path


def docstring_paragraphs(max_chars: int, roots: list[Path] | None = None) -> list[str]:
    """Distinct docstring paragraphs (modules, classes, functions), up to max_chars in all."""
    paths = sysconfig.get_paths()
    roots = roots or [Path(paths["stdlib"]), *{Path(paths["purelib"]), Path(paths["platlib"])}]
    roots = sorted(set(roots), key=lambda r: (r != Path(paths["stdlib"]), str(r)))
    paragraphs, seen, total = [], set(), 0
    for path in python_files(roots):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately invalid (test data, other encodings)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            for para in (doc or "").split("\n\n"):
                para = " ".join(para.split())
                if len(para) < 40 or para in seen:
                    continue
                seen.add(para)
                paragraphs.append(para)
                total += len(para)
                if total >= max_chars:
                    return paragraphs
    if not paragraphs:
        raise PipelineError(f"demo.general_corpus python-docs: no docstrings found under {roots}")
    return paragraphs
