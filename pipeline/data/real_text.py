"""Real-text traffic from documents every machine has offline: the running Python's standard library docs.

The demo's "Nimbus" traffic is templated, and a model learns it almost exactly, so its gates and acceptance
rates say little about real use (issue #29). Here a user asks about a stdlib module, function, class or method
in one of several phrasings (some with the documentation pasted in), and the assistant's answer is that
object's real docstring: short answers are its summary paragraph (or its signature and summary), long ones the
whole docstring up to a cap; multi-turn conversations follow up on other objects of the same module.

A *document* is one top-level stdlib module or package (`json`, `email`: its submodules included). Every row
carries it as `group`, which the `data` stage splits by, so held-out traffic is about documents the draft
never saw. Docstrings are read from the source with `ast` (nothing is imported: some stdlib modules act when
imported), files in sorted order, and the rows are drawn with a seeded RNG: the same Python version and seed
give the same file byte for byte. Another Python version has other docstrings, hence other rows; the
generator's version is written beside the traffic (`<stem>.source.json`) and the `data` stage records it.

    modelprep traffic python-docs            # writes data/python-docs/traffic.jsonl and traffic.source.json
"""

from __future__ import annotations

import ast
import json
import platform
import random
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pipeline.core.errors import PipelineError
from pipeline.core.io import atomic_write_text
from pipeline.data.traffic import source_path

GENERATOR = "python-docs"
T = TypeVar("T")

# Not documentation of the language's library: tests, IDLE, demos, a removed-API converter, vendored wheels.
SKIP_PARTS = {
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "__phello__",
    "pydoc_data",
}
MIN_DOC_CHARS = 40  # shorter docstrings ("Return self.") are not worth a question
MIN_ENTRIES = 3  # a document needs this many documented objects (module docstring included)

# Kinds of conversation and how often each is drawn (a single turn unless named multi).
KINDS = {"summary": 0.22, "full": 0.18, "signature": 0.08, "context": 0.14, "module": 0.08, "multi": 0.30}

SUMMARY_Q = [
    "What does {name} do?",
    "In one sentence, what is {name} for?",
    "Briefly, what does Python's {name} do?",
    "Quick question: what is `{name}`?",
    "What's the purpose of {name} in the {module} module?",
]
FULL_Q = [
    "Show me the documentation of {name}.",
    "Explain {name} in detail.",
    "How do I use {name}? Please give me the full docs.",
    "I need the complete reference for `{name}`.",
    "What does the docstring of {name} say?",
]
SIGNATURE_Q = ["What arguments does {name} take?", "What is the signature of {name}?", "How do I call {name}?"]
CONTEXT_Q = [
    "Here is the documentation of {name}:\n\n{doc}\n\nSummarize it in one sentence.",
    "{doc}\n\nThat is the docstring of {name}. What does it do, in short?",
    'I found this in the {module} docs:\n\n"""\n{doc}\n"""\n\nWhat is the gist of it?',
]
MODULE_Q = [
    "What is the {module} module for?",
    "Give me an overview of Python's {module} module.",
    "What does the {module} module provide?",
]
FOLLOW_SHORT_Q = [
    "And what does {name} do?",
    "What about {name}?",
    "Is there something related? What is {name}?",
    "Thanks. And {name}?",
]
FOLLOW_FULL_Q = [
    "Now show me the docs of {name}.",
    "Can you give me the full documentation of {name} too?",
    "How do I use {name} from the same module?",
]


@dataclass(frozen=True)
class Entry:
    """One documented object: `json.dumps`, `json.JSONDecoder.decode`, or the module `json` itself."""

    name: str  # dotted, as a user would write it
    module: str  # the module it is defined in (json.decoder)
    signature: str  # "(obj, *, skipkeys=False, ...)"; "" for a module
    doc: str  # the cleaned docstring (inspect.cleandoc, as ast.get_docstring gives it)

    @property
    def summary(self) -> str:
        """The docstring's first paragraph on one line: what `help()` shows first."""
        return " ".join(self.doc.split("\n\n")[0].split())


@dataclass(frozen=True)
class Document:
    name: str  # the top-level module or package: the unit of the held-out split
    entries: tuple[Entry, ...]  # module docstrings first, then objects in source order


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_name(path: Path, root: Path) -> str | None:
    """The dotted module name of a stdlib file, or None for a private, test or non-library one."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or SKIP_PARTS & set(parts) or any(p.startswith("_") for p in parts) or "-" in parts[0]:
        return None
    return ".".join(parts)


def stdlib_parsed(root: Path, read: Callable[[str, str], T]) -> list[tuple[str, T]]:
    """(module, read(source, module)) of every library file under root, sorted (module_name); a file that does not
    read or parse is left out."""
    out = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        if module is None:
            continue
        try:
            out.append((module, read(path.read_text(encoding="utf-8"), module)))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately invalid (test data, other encodings)
    return out


def _signature(node: ast.AST) -> str:
    if isinstance(node, ast.ClassDef):
        init = next(
            (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__"),
            None,
        )
        if init is None:
            return ""
        args = ast.unparse(init.args)
        return "(" + (args.split(",", 1)[1].strip() if "," in args else "") + ")"  # without self
    args = ast.unparse(node.args)
    if args.split(",")[0].strip() in ("self", "cls"):
        args = args.split(",", 1)[1].strip() if "," in args else ""
    return f"({args})"


def _documented(doc: str | None) -> bool:
    return bool(doc) and len(doc) >= MIN_DOC_CHARS


def module_entries(source: str, module: str) -> list[Entry]:
    """The module's docstring, its public functions and classes, and their public methods, each with a docstring
    of at least MIN_DOC_CHARS characters, in source order."""
    tree = ast.parse(source)
    entries = []
    if _documented(doc := ast.get_docstring(tree)):
        entries.append(Entry(module, module, "", doc))
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        if _documented(doc := ast.get_docstring(node)):
            entries.append(Entry(f"{module}.{node.name}", module, _signature(node), doc))
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if (
                    isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not sub.name.startswith("_")
                    and _documented(doc := ast.get_docstring(sub))
                ):
                    entries.append(Entry(f"{module}.{node.name}.{sub.name}", module, _signature(sub), doc))
    return entries


def stdlib_documents(root: Path | None = None) -> list[Document]:
    """Every top-level stdlib module or package with at least MIN_ENTRIES documented objects, sorted by name."""
    root = root or stdlib_root()
    by_top: dict[str, list[Entry]] = {}
    for module, entries in stdlib_parsed(root, module_entries):
        by_top.setdefault(module.split(".")[0], []).extend(entries)
    docs = [
        Document(top, tuple(sorted(es, key=lambda e: e.name != e.module)))  # module docstrings first (stable)
        for top, es in sorted(by_top.items())
        if len(es) >= MIN_ENTRIES
    ]
    if not docs:
        raise PipelineError(f"traffic python-docs: no documented modules found under {root}")
    return docs


def capped(text: str, max_chars: int) -> str:
    """Whole paragraphs of text up to max_chars; a first paragraph longer than that is cut at a word boundary."""
    paragraphs, out = text.split("\n\n"), []
    for para in paragraphs:
        if len("\n\n".join([*out, para])) > max_chars:
            break
        out.append(para)
    if out:
        return "\n\n".join(out)
    return paragraphs[0][:max_chars].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


def _turn(rng: random.Random, entry: Entry, long: bool, max_chars: int, questions: list[str]) -> tuple[str, str]:
    question = rng.choice(questions).format(name=entry.name, module=entry.module)
    return question, capped(entry.doc, max_chars) if long else capped(entry.summary, max_chars)


def conversation(rng: random.Random, doc: Document, kind: str, max_answer_chars: int) -> list[dict]:
    """One conversation of `kind` about doc (see KINDS)."""
    objects = [e for e in doc.entries if e.name != e.module] or list(doc.entries)
    modules = [e for e in doc.entries if e.name == e.module]
    entry = rng.choice(objects)
    if kind == "module" and modules:
        entry = rng.choice(modules)
        turns = [_turn(rng, entry, rng.random() < 0.5, max_answer_chars, MODULE_Q)]
    elif kind == "module":  # no module docstring: a question about one of its objects instead
        turns = [_turn(rng, entry, False, max_answer_chars, SUMMARY_Q)]
    elif kind == "summary":
        turns = [_turn(rng, entry, False, max_answer_chars, SUMMARY_Q)]
    elif kind == "full":
        turns = [_turn(rng, entry, True, max_answer_chars, FULL_Q)]
    elif kind == "signature":
        entry = rng.choice([e for e in objects if e.signature] or objects)
        question = rng.choice(SIGNATURE_Q).format(name=entry.name, module=entry.module)
        turns = [(question, capped(f"{entry.name}{entry.signature}\n\n{entry.summary}", max_answer_chars))]
    elif kind == "context":
        question = rng.choice(CONTEXT_Q).format(
            name=entry.name, module=entry.module, doc=capped(entry.doc, max_answer_chars)
        )
        turns = [(question, capped(entry.summary, max_answer_chars))]
    elif kind == "multi":
        # a first question, then one or two follow-ups on other objects of the same document, mostly short
        others = rng.sample(objects, min(len(objects), 2 + rng.randrange(2)))
        first_long = rng.random() < 0.3
        turns = [_turn(rng, others[0], first_long, max_answer_chars, FULL_Q if first_long else SUMMARY_Q)]
        for other in others[1:]:
            long = rng.random() < 0.25
            turns.append(_turn(rng, other, long, max_answer_chars, FOLLOW_FULL_Q if long else FOLLOW_SHORT_Q))
    else:
        raise PipelineError(f"traffic python-docs: unknown conversation kind {kind!r}")
    return [m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]


def generate(rows: int, seed: int, max_answer_chars: int, documents: list[Document] | None = None) -> list[dict]:
    """`rows` distinct conversations, each {"messages": [...], "group": <document>}: a document drawn uniformly
    (a big package gets no more rows than a small module), then a kind by KINDS' weights."""
    if rows < 1 or max_answer_chars < MIN_DOC_CHARS:
        raise PipelineError(f"traffic python-docs: rows must be >= 1 and max_answer_chars >= {MIN_DOC_CHARS}")
    documents = documents if documents is not None else stdlib_documents()
    return distinct_conversations(
        random.Random(seed),
        documents,
        KINDS,
        lambda rng, doc, kind: conversation(rng, doc, kind, max_answer_chars),
        rows,
        "python-docs",
    )


def distinct_conversations(
    rng: random.Random, sources: list, kinds: dict[str, float], make, rows: int, what: str
) -> list[dict]:
    """`rows` distinct rows, each `make(rng, source, kind)`'s messages about a source drawn at random (kind drawn by
    its weight), grouped by the source's name; one error line when the sources can't give that many."""
    names, weights = zip(*kinds.items())
    out, seen = [], set()
    for _ in range(rows * 20):  # draws that repeat a conversation are skipped; give up well past rows
        source = rng.choice(sources)
        messages = make(rng, source, rng.choices(names, weights)[0])
        key = json.dumps(messages)
        if key in seen:
            continue
        seen.add(key)
        out.append({"messages": messages, "group": source.name})
        if len(out) == rows:
            return out
    raise PipelineError(f"traffic {what}: only {len(out)} distinct conversations for rows {rows}")


def source_record(rows: list[dict], seed: int, max_answer_chars: int, documents: list[Document]) -> dict:
    """What the traffic was made from: the Python version decides the docstrings, so the same seed on another
    version gives other rows."""
    return {
        **record_head(GENERATOR, rows, seed),
        "max_answer_chars": max_answer_chars,
        "documents_available": len(documents),
        "documents_used": len({r["group"] for r in rows}),
        **turn_counts(rows),
    }


def record_head(generator: str, rows: list[dict], seed: int) -> dict:
    """The source record's first keys: the generator and the Python whose stdlib it read, the seed, the rows."""
    return {
        "generator": generator,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "seed": seed,
        "rows": len(rows),
    }


def turn_counts(rows: list[dict]) -> dict:
    turns = [sum(m["role"] == "user" for m in r["messages"]) for r in rows]
    return {"multi_turn_rows": sum(t > 1 for t in turns), "single_turn_rows": sum(t == 1 for t in turns)}


def write(out: Path, rows: int, seed: int, max_answer_chars: int) -> dict:
    """The traffic file and its source record beside it (data.source_path, which the data stage reads)."""
    documents = stdlib_documents()
    convs = generate(rows, seed, max_answer_chars, documents)
    record = source_record(convs, seed, max_answer_chars, documents)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in convs))
    atomic_write_text(source_path(out), json.dumps(record, indent=2) + "\n")
    return record
