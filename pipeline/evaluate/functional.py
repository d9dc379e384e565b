"""Does a variant still write code that works: pass@1 on HumanEval-format tasks, the code run only in the sandbox.

A task file is JSONL, one task a line with HumanEval's fields: `task_id`, `prompt` (a signature and docstring),
`canonical_solution` (a body that passes), `test` (defines `check(candidate)`) and `entry_point` (the function's
name). The model completes `prompt` greedily as plain text (no chat template: the prompt is code to continue), the
completion is cut where HumanEval cuts it (a new top-level `def`, `class`, `if`, `print` or comment) and before the
first control token the model writes (control_token_ids: one that writes Qwen's <|fim_prefix|> has left the
function), and `prompt + completion + test + check(entry_point)` runs in pipeline/evaluate/sandbox.py. pass@1 with
greedy decoding is the fraction of tasks whose program passed; every other outcome (failed, timeout, memory,
forbidden, error) counts as a failure and is counted by kind.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json
from pipeline.core.jsonl import read_lines
from pipeline.core.stage import progress
from pipeline.data.functional_code import Task, task_from_row  # the HumanEval row, declared once
from pipeline.evaluate import generation, sandbox
from pipeline.evaluate.sandbox import Limits, Outcome
from pipeline.evaluate.settings import FunctionalCheck
from pipeline.evaluate.summary import Functional

# HumanEval's stop sequences (Chen et al. 2021): the function ends where a new top-level statement begins
STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
KEPT_CHARS = 2000  # of each completion in the per-task record
# A control token's text: `<|name|>` (Qwen's <|fim_prefix|>, <|file_sep|>, GPT's <|endoftext|>, Llama 3, Phi-3) or
# DeepSeek's fullwidth `<｜name｜>`; and, for an added token, markup `<name_part>` / `</name_part>` (StarCoder's
# <fim_prefix>, Qwen's <tool_call>, Gemma's <start_of_turn>). Markup without an underscore is left as text: Gemma's
# vocabulary adds HTML tags (<b>, </b>, <code>, <table>) as user-defined tokens, which a program's strings write.
CONTROL_FORM = re.compile(r"<([|\uff5c])[^\s|\uff5c]+\1>")
MARKUP_FORM = re.compile(r"</?[^\s<>/_]*_[^\s<>/]*>")


@dataclass(frozen=True)
class TaskResult:
    task_id: str
    outcome: str  # sandbox.Outcome's value
    detail: str
    completion: str  # as run (cut at the stop sequence), at most KEPT_CHARS


@dataclass(frozen=True)
class PassAtOne:
    """One model's pass@1 over the task file: passed / tasks, every outcome counted by kind."""

    tasks: int
    passed: int
    pass_at_1: float
    outcomes: dict[str, int]
    results: list[TaskResult] = field(default_factory=list)


def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    """The first `limit` tasks of a JSONL file; a missing file, a bad line or a missing field is one error naming the
    file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"evaluate.functional.tasks: {path} not found")
    tasks = []
    for line in read_lines(path):
        tasks.append(task_from_row(line.row, line.where))
        if limit is not None and len(tasks) >= limit:
            break
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise PipelineError(f"{path}: task_id {next(i for i in ids if ids.count(i) > 1)!r} repeated")
    if not tasks:
        raise PipelineError(f"{path}: no tasks")
    return tasks


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cut(completion: str) -> str:
    """The completion up to HumanEval's first stop sequence."""
    ends = [i for i in (completion.find(s) for s in STOP) if i >= 0]
    return completion[: min(ends)] if ends else completion


def program(task: Task, completion: str) -> str:
    """What the sandbox runs: the prompt, the completion, the task's tests, and the call that applies them."""
    return f"{task.prompt}{completion}\n\n{task.test}\n\ncheck({task.entry_point})\n"


def run_task(task: Task, completion: str, limits: Limits) -> TaskResult:
    result = sandbox.run(program(task, completion), limits)
    return TaskResult(task.task_id, result.outcome.value, result.detail, completion[:KEPT_CHARS])


def score(tasks: list[Task], completions: list[str], limits: Limits) -> PassAtOne:
    """Each task's program run in the sandbox; pass@1 over them."""
    results = [run_task(t, c, limits) for t, c in progress(list(zip(tasks, completions)), desc="functional check")]
    counts = collections.Counter(r.outcome for r in results)
    passed = counts[Outcome.PASSED.value]
    return PassAtOne(len(results), passed, passed / len(results), {o.value: counts[o.value] for o in Outcome}, results)


def _stops_at_text(tokenizer):
    """generation's `done`: a row ends once its decoded text holds a stop sequence (no tokens wasted past it)."""

    def done(tokens: list[int]) -> bool:
        tail = tokenizer.decode(tokens[-8:], skip_special_tokens=True)  # a stop sequence spans a few tokens at most
        return any(s in tail for s in STOP)

    return done


def control_token_ids(tokenizer) -> frozenset[int]:
    """The ids that end a completion: the tokenizer's special tokens, its added tokens written as control tokens or
    markup, and every token of the vocabulary written `<|name|>`.

    Not every added token: a non-special added token can be ordinary text (Phi-2's and CodeGen's runs of spaces,
    which code needs; Gemma's HTML tags, hence markup only with an underscore). Not only special ones: Qwen marks its
    FIM, repo and file-separator tokens `special: false`, so a decode keeps them and generation ran on past them.
    The whole vocabulary for `<|name|>`: a GGUF-converted Qwen tokenizer (transformers' GGUFQwen2Converter,
    pipeline/models/gguf_source.py) adds only <|endoftext|>, <|im_start|> and <|im_end|>; its other control tokens
    are plain vocabulary entries there."""
    ids = set(tokenizer.all_special_ids)
    for i, token in tokenizer.added_tokens_decoder.items():
        if token.special or CONTROL_FORM.fullmatch(token.content) or MARKUP_FORM.fullmatch(token.content):
            ids.add(i)
    ids.update(i for text, i in tokenizer.get_vocab().items() if CONTROL_FORM.fullmatch(text))
    return frozenset(ids)


def complete(model, tokenizer, tasks: list[Task], max_new_tokens: int) -> list[str]:
    """Each prompt's greedy completion as text, ended at eos or any other control token (cut before it) and cut at
    HumanEval's stop sequences (the prompt as plain text: a tokenizer that adds <bos> adds it here too)."""
    prompts = [tokenizer(t.prompt)["input_ids"] for t in tasks]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    stops = control_token_ids(tokenizer) | (frozenset() if eos is None else {eos})
    written = generation.greedy_continuations(
        model, prompts, max_new_tokens, stops, pad_id=pad, done=_stops_at_text(tokenizer), desc="functional decode"
    )
    out = []
    for ids, (tokens, end) in zip(prompts, written):
        if end and tokens[end - 1] in stops:
            end -= 1  # the completion ends before its control token (a decode keeps a non-special one)
        # decoded with the prompt: a tokenizer that merges a leading space into the next piece decodes it right only
        # in context
        head = tokenizer.decode(ids, skip_special_tokens=True)
        full = tokenizer.decode(ids + tokens[:end], skip_special_tokens=True)
        text = full[len(head) :] if full.startswith(head) else tokenizer.decode(tokens[:end], skip_special_tokens=True)
        out.append(cut(text))
    return out


def pass_at_1(model, tokenizer, tasks: list[Task], max_new_tokens: int, limits: Limits) -> PassAtOne:
    return score(tasks, complete(model, tokenizer, tasks, max_new_tokens), limits)


def limits_of(cfg: FunctionalCheck) -> Limits:
    return Limits(wall_s=cfg.timeout_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb)


def tasks_of(cfg: FunctionalCheck) -> list[Task] | None:
    """evaluate.functional's tasks, read and checked before any model loads; None: the check is off."""
    return None if cfg.tasks is None else load_tasks(cfg.tasks, cfg.limit)


def baseline_key(cfg: FunctionalCheck) -> dict:
    """What a recorded baseline must have been measured with to stand for this configuration's: the tasks, the
    check's settings, and where the target ran (float32 on CPU, bfloat16 on a GPU: a record pulled from a DVC cache
    made on the other kind of machine is another model's run)."""
    from pipeline.models.loading import eval_device, eval_dtype

    device = eval_device()
    return {
        "tasks_file": cfg.tasks,
        "sha256": file_sha256(cfg.tasks),
        "limit": cfg.limit,
        "max_new_tokens": cfg.max_new_tokens,
        "limits": dataclasses.asdict(limits_of(cfg)),
        "device": f"{device.type} {str(eval_dtype(device)).removeprefix('torch.')}",
    }


def write_baseline(path: str | Path, run: PassAtOne, cfg: FunctionalCheck) -> None:
    """The unquantized target's pass@1 (stage functional_baseline), with what it was measured on and how."""
    write_json(path, {**baseline_key(cfg), "baseline": dataclasses.asdict(run)})


def read_baseline(path: str | Path, cfg: FunctionalCheck) -> PassAtOne:
    """The recorded baseline, refused (one line naming the file and the field) where it was measured on other tasks
    or settings than these: a stale record would compare a variant with another check's baseline."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path}: not found (run stage functional_baseline first: dvc repro)")
    data = records.read_object(path)
    for key, want in baseline_key(cfg).items():
        if data.get(key) != want:
            raise PipelineError(
                f"{path}: {key} {data.get(key)!r} is not this configuration's {want!r} (dvc repro functional_baseline)"
            )
    return records.from_dict(PassAtOne, data.get("baseline"), f"{path}: baseline")


def measure(
    base: PassAtOne, variant, tokenizer, tasks: list[Task], cfg: FunctionalCheck, same_weights: bool
) -> tuple[Functional, PassAtOne, PassAtOne]:
    """The variant's pass@1 against the unquantized target's (`base`: measured once for every variant, by stage
    functional_baseline), and the drop (same_weights: the variant is the target itself, bf16's `algorithm: none`,
    so its completions are the baseline's and are not generated again). One baseline for all variants: greedy
    decoding is not bit-identical across processes (on a 4-GPU host BF16 passed 84 tasks in two evaluate processes
    and 83 in a third), and each variant's drop is then taken against the same one."""
    own = base if same_weights else pass_at_1(variant, tokenizer, tasks, cfg.max_new_tokens, limits_of(cfg))
    return (
        Functional(
            tasks=len(tasks),
            pass_at_1_baseline=base.pass_at_1,
            pass_at_1=own.pass_at_1,
            pass_at_1_drop=base.pass_at_1 - own.pass_at_1,
            outcomes=own.outcomes,
            baseline_outcomes=base.outcomes,
        ),
        base,
        own,
    )
