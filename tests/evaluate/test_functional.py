"""The functional check (pipeline/evaluate/functional.py): HumanEval-format tasks, a model's greedy completions run in
the sandbox, pass@1 of the target and of a variant, the summary's metrics and the gate on the drop."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from eval_helpers import gate_report
from pipeline.core.errors import PipelineError
from pipeline.evaluate import functional
from pipeline.evaluate.sandbox import Limits
from pipeline.evaluate.settings import EvaluateParams, FunctionalCheck
from pipeline.evaluate.summary import EvalSummary, Functional, load_metrics
from pipeline.release.gates import NO_FUNCTIONAL
from pipeline.rules import validate
from tiny_chatml import chatml_tokenizer, tiny_llama
from tiny_project import ROOT, tiny_params

LIMITS = Limits(wall_s=4.0, cpu_s=2, memory_mb=512)
TASKS = [
    {
        "task_id": "Tiny/0",
        "prompt": 'def add(a: int, b: int) -> int:\n    """The sum of a and b."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
    },
    {
        "task_id": "Tiny/1",
        "prompt": 'def is_even(n: int) -> bool:\n    """Whether n is even."""\n',
        "canonical_solution": "    return n % 2 == 0\n",
        "test": "def check(candidate):\n    assert candidate(4)\n    assert not candidate(7)\n",
        "entry_point": "is_even",
    },
    {
        "task_id": "Tiny/2",
        "prompt": 'def first_word(s: str) -> str:\n    """The text before the first space."""\n',
        "canonical_solution": "    return s.split(' ')[0]\n",
        "test": "def check(candidate):\n    assert candidate('hello world') == 'hello'\n",
        "entry_point": "first_word",
    },
]


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "functional.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


def test_canonical_solutions_pass_through_the_same_runner(task_file):
    tasks = functional.load_tasks(task_file)
    result = functional.score(tasks, [t.canonical_solution for t in tasks], LIMITS)
    assert (result.tasks, result.passed, result.pass_at_1) == (3, 3, 1.0)
    assert result.outcomes == {"passed": 3, "failed": 0, "timeout": 0, "memory": 0, "forbidden": 0, "error": 0}


def test_each_bad_completion_is_a_failure_counted_by_kind(task_file):
    tasks = functional.load_tasks(task_file)
    completions = [
        "    return a - b\n",  # wrong
        "    while True:\n        pass\n",  # loops
        "    import os\n    os.system('true')\n    return s.split(' ')[0]\n",
    ]  # right answer, forbidden call
    result = functional.score(tasks, completions, LIMITS)
    assert result.pass_at_1 == 0.0
    assert [r.outcome for r in result.results] == ["failed", "timeout", "forbidden"]
    assert result.outcomes["failed"] == result.outcomes["timeout"] == result.outcomes["forbidden"] == 1


def test_completions_are_cut_where_humaneval_cuts_them():
    assert functional.cut("    return 1\n\ndef other():\n    pass\n") == "    return 1\n"
    assert functional.cut("    return 1\nif __name__ == '__main__':\n    main()") == "    return 1"
    assert functional.cut("    return 1\nprint(f())\n") == "    return 1"
    kept = "    x = 1  # a comment inside stays\n    return x\n"
    assert functional.cut(kept) == kept


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", r"functional.jsonl:2: not valid JSON"),
        (json.dumps({**TASKS[0], "task_id": "Tiny/9", "entry_point": ""}), r"functional.jsonl:2: field 'entry_point'"),
        (json.dumps({k: v for k, v in TASKS[0].items() if k != "test"}), r"functional.jsonl:2: field 'test'"),
        (json.dumps(TASKS[0]), r"task_id 'Tiny/0' repeated"),
        # read as traffic is (pipeline/core/jsonl.py): bytes, so a bad encoding or a deep nesting is the line's own
        # error
        (b'{"task_id": "Tiny/\xff"}', r"functional.jsonl:2: not valid UTF-8 \(byte 0xff at offset 18"),
        ("[" * 100000 + "]" * 100000, r"functional.jsonl:2: JSON nested too deeply"),
    ],
)
def test_a_bad_task_file_is_one_line_naming_the_file_and_line(line, message, tmp_path):
    path = tmp_path / "functional.jsonl"
    line = line if isinstance(line, bytes) else line.encode()
    path.write_bytes((json.dumps(TASKS[0]) + "\n").encode() + line + b"\n")
    with pytest.raises(PipelineError, match=message) as err:
        functional.load_tasks(path)
    assert "\n" not in str(err.value)


def test_a_tiny_model_end_to_end(task_file):
    """A randomly initialised model writes junk: its completions are decoded, cut, run in the sandbox and counted;
    the same model as baseline and variant loses nothing."""
    tokenizer = chatml_tokenizer()
    model = tiny_llama(tokenizer, layers=1, tied=True)
    tasks = functional.load_tasks(task_file, limit=2)
    completions = functional.complete(model, tokenizer, tasks, max_new_tokens=12)
    assert len(completions) == 2 and all(isinstance(c, str) for c in completions)
    assert not any(stop in c for c in completions for stop in functional.STOP)
    cfg = FunctionalCheck(tasks=str(task_file), max_new_tokens=12, timeout_s=4.0, cpu_s=2, memory_mb=512)
    recorded = functional.pass_at_1(model, tokenizer, tasks, cfg.max_new_tokens, functional.limits_of(cfg))
    works, base, own = functional.measure(recorded, model, tokenizer, tasks, cfg, same_weights=False)
    assert base is recorded and own is not recorded  # the variant's completions generated, the baseline's reused
    assert works.tasks == 2 and sum(works.outcomes.values()) == 2 == sum(works.baseline_outcomes.values())
    assert works.outcomes["passed"] == 0  # random weights write no working function
    assert all(r.outcome == "failed" and r.detail for r in own.results)
    assert works.pass_at_1 == base.pass_at_1 == own.pass_at_1 == 0.0
    assert works.pass_at_1_drop == 0.0
    assert [r.completion for r in own.results] == completions  # greedy: the same text twice


def baseline_run(passed: int, tasks: int = 4) -> functional.PassAtOne:
    results = [
        functional.TaskResult(f"T/{i}", "passed" if i < passed else "failed", "", "    return 1\n")
        for i in range(tasks)
    ]
    return functional.PassAtOne(tasks, passed, passed / tasks, {"passed": passed, "failed": tasks - passed}, results)


def test_the_recorded_baseline_is_what_every_variant_compares_with(task_file, tmp_path):
    """Stage functional_baseline records the target's run once; evaluate reads it back whole and takes each
    variant's drop against it (bf16, the target itself, generates nothing: its run is the baseline's)."""
    cfg = FunctionalCheck(tasks=str(task_file), max_new_tokens=12)
    record = tmp_path / "baseline.json"
    functional.write_baseline(record, baseline_run(3), cfg)
    back = functional.read_baseline(record, cfg)
    assert back == baseline_run(3)
    works, base, own = functional.measure(back, None, None, [], cfg, same_weights=True)
    assert own is base is back and works.pass_at_1_drop == 0.0 and works.pass_at_1 == 0.75


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda cfg, path: (dataclasses.replace(cfg, max_new_tokens=13), path), "max_new_tokens"),
        (lambda cfg, path: (dataclasses.replace(cfg, limit=1), path), "limit"),
        (lambda cfg, path: (dataclasses.replace(cfg, timeout_s=3.0), path), "limits"),
        (lambda cfg, path: (cfg, path.write_text(path.read_text() + "\n")), "sha256"),  # the task file edited
    ],
)
def test_a_baseline_recorded_for_other_tasks_or_settings_is_refused(task_file, tmp_path, change, field):
    cfg = FunctionalCheck(tasks=str(task_file), max_new_tokens=12)
    record = tmp_path / "baseline.json"
    functional.write_baseline(record, baseline_run(1), cfg)
    now, _ = change(cfg, task_file)
    with pytest.raises(PipelineError, match=rf"^{re.escape(str(record))}: {field} .* functional_baseline\)$"):
        functional.read_baseline(record, now)


def test_a_missing_or_broken_baseline_is_one_line_naming_the_file(task_file, tmp_path):
    cfg = FunctionalCheck(tasks=str(task_file), max_new_tokens=12)
    with pytest.raises(PipelineError, match="baseline.json: not found .*functional_baseline"):
        functional.read_baseline(tmp_path / "baseline.json", cfg)
    (tmp_path / "baseline.json").write_text('{"skipped": "evaluate.functional.tasks is not set"')
    with pytest.raises(PipelineError, match="baseline.json is not valid JSON"):  # records.read_object's line
        functional.read_baseline(tmp_path / "baseline.json", cfg)
    (tmp_path / "baseline.json").write_text('{"skipped": "evaluate.functional.tasks is not set"}')
    with pytest.raises(PipelineError, match="baseline.json: tasks_file None is not"):
        functional.read_baseline(tmp_path / "baseline.json", cfg)


def summary_with(functional_result: Functional | None) -> EvalSummary:
    return EvalSummary(variant="gptq-w4a16", functional=functional_result)


def test_the_summary_carries_pass_at_1_and_reads_it_back(tmp_path):
    works = Functional(
        tasks=10, pass_at_1_baseline=0.6, pass_at_1=0.4, pass_at_1_drop=0.2, outcomes={"passed": 4, "failed": 6}
    )
    metrics = summary_with(works).to_metrics()
    assert (metrics["functional_tasks"], metrics["pass_at_1"], metrics["pass_at_1_drop"]) == (10, 0.4, 0.2)
    back = EvalSummary.from_metrics(metrics, "eval-gptq-w4a16.json").functional
    assert (back.tasks, back.pass_at_1_baseline, back.pass_at_1, back.pass_at_1_drop) == (10, 0.6, 0.4, 0.2)
    summary_with(works).write(tmp_path / "summary.json")
    assert EvalSummary.load(tmp_path / "summary.json").functional == works
    # a pass@1 no run can give (a hand-edited metrics file) is one line, before any gate reads it
    with pytest.raises(PipelineError, match=r"pass_at_1 is 1.5, which no measurement can give"):
        EvalSummary.from_metrics({**metrics, "pass_at_1": 1.5}, "eval-gptq-w4a16.json")


def test_without_the_check_the_summary_and_metrics_are_as_before(tmp_path):
    """The demo build has no task file: its summary.json and metrics hold nothing new (dvc.lock compares them)."""
    summary_with(None).write(tmp_path / "summary.json")
    assert "functional" not in json.loads((tmp_path / "summary.json").read_text())
    assert not any("pass_at_1" in k for k in summary_with(None).to_metrics())
    path = ROOT / "benchmarks/cpu/raw/demo-metrics/eval-bf16.json"
    committed = load_metrics(path)
    assert committed.functional is None and committed.to_metrics() == json.loads(path.read_text())


def metrics_of(drop: float | None) -> dict:
    base = {
        "perplexity_increase_pct": 0.1,
        "kl_divergence": 0.001,
        "top1_agreement": 0.99,
        "perplexity": 3.0,
        "accepted_per_draft_token": 0.8,
        "estimated_num_speculative_tokens": 4,
    }
    return (
        base
        if drop is None
        else {
            **base,
            "functional_tasks": 20,
            "pass_at_1_baseline": 0.5,
            "pass_at_1": 0.5 - drop,
            "pass_at_1_drop": drop,
        }
    )


def test_the_gate_fails_a_variant_that_lost_more_pass_at_1_than_allowed():
    p = tiny_params(gates={"thresholds": {"max_pass_at_1_drop": 0.05}})
    summaries = {
        v: EvalSummary.from_metrics(metrics_of(d), v)
        for v, d in (("gptq-w4a16", 0.2), ("fp8-dynamic", 0.05), ("awq-w4a16", None))
    }
    report = gate_report(p, summaries)
    check = {v: next(c for c in r.checks if c.check == "max_pass_at_1_drop") for v, r in report.variants.items()}
    assert check["gptq-w4a16"].failed and not report.variants["gptq-w4a16"].passed
    assert "pass_at_1_drop=0.2, needs <= 0.05 (over by 0.15)" in check["gptq-w4a16"].describe()
    assert check["fp8-dynamic"].passed is True and report.variants["fp8-dynamic"].passed
    # no task file: skipped with the reason, neither failed nor passed
    assert check["awq-w4a16"].passed is None and check["awq-w4a16"].skipped == NO_FUNCTIONAL
    assert report.variants["awq-w4a16"].passed


def test_functional_params_are_checked_up_front(tmp_path):
    p = tiny_params(evaluate={"functional": {"tasks": "evals/missing.jsonl"}})
    with pytest.raises(PipelineError, match=r"evaluate.functional.tasks evals/missing.jsonl not found"):
        validate(p, tmp_path / "params.yaml")
    # outside evals/ (which every evaluate stage depends on), an edited task file would re-run nothing
    for outside in (str(tmp_path / "tasks.jsonl"), "data/human-eval/functional.jsonl", "evals/../x.jsonl"):
        p = tiny_params(evaluate={"functional": {"tasks": outside}})
        with pytest.raises(PipelineError, match=r"must be a file under evals/"):
            validate(p, tmp_path / "params.yaml")
    p = tiny_params(evaluate={"functional": {"timeout_s": 0}})
    with pytest.raises(PipelineError, match=r"evaluate.functional.timeout_s"):
        validate(p, tmp_path / "params.yaml")
    p = tiny_params(evaluate={"functional": {"task": "x.jsonl"}})
    with pytest.raises(PipelineError, match=r"evaluate.functional.task"):
        validate(p, tmp_path / "params.yaml")
    default = EvaluateParams.parse(tiny_params()["evaluate"]).functional
    assert default.tasks is None and default == FunctionalCheck()


def test_generation_stops_where_done_says_and_writes_the_same_tokens_before():
    """greedy_continuations' `done` (a stop that is text): the row ends at the first length it holds, with the
    tokens an unstopped run writes up to there."""
    from pipeline.evaluate import generation

    tokenizer = chatml_tokenizer()
    model = tiny_llama(tokenizer, layers=1, tied=True)
    prompts = [tokenizer(t["prompt"])["input_ids"] for t in TASKS]
    full = generation.greedy_continuations(model, prompts, 10)
    stopped = generation.greedy_continuations(model, prompts, 10, done=lambda tokens: len(tokens) >= 4)
    assert [end for _, end in full] == [10] * 3 and [end for _, end in stopped] == [4] * 3
    assert [t[:4] for t, _ in stopped] == [t[:4] for t, _ in full]


def test_a_completion_ends_before_a_control_token_the_tokenizer_does_not_call_special(task_file):
    """Qwen marks <|fim_prefix|> `special: false`: a decode keeps it, so a completion that ran on past it failed as a
    SyntaxError. The model here writes it as its fourth token on the first task; that completion is the three
    tokens before it, and the other tasks' completions are what the unchanged model writes."""
    import torch
    from tokenizers import AddedToken

    from pipeline.evaluate import generation

    tokenizer = chatml_tokenizer()
    tokenizer.add_tokens([AddedToken("<|fim_prefix|>", special=False, normalized=False)])
    fim = tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    model = tiny_llama(tokenizer, layers=1, tied=False)
    tasks = functional.load_tasks(task_file)
    prompts = [tokenizer(t.prompt)["input_ids"] for t in tasks]
    unchanged = functional.complete(model, tokenizer, tasks, max_new_tokens=12)
    first = generation.greedy_continuations(model, prompts, 12)[0][0]
    with torch.no_grad():  # scores <|fim_prefix|> above the fourth token wherever that token would win
        model.lm_head.weight[fim] = model.lm_head.weight[first[3]] * 1.05
    written = generation.greedy_continuations(model, prompts, 12)
    assert written[0][0][:4] == first[:3] + [fim]  # the model does write it, after three ordinary tokens
    assert all(fim not in tokens for tokens, _ in written[1:])
    completions = functional.complete(model, tokenizer, tasks, max_new_tokens=12)
    head = tokenizer.decode(prompts[0], skip_special_tokens=True)
    assert completions[0] == tokenizer.decode(prompts[0] + first[:3], skip_special_tokens=True)[len(head) :]
    assert completions[0] and "<|fim_prefix|>" not in completions[0]
    assert completions[1:] == unchanged[1:]


def test_control_tokens_are_special_ones_and_those_written_as_control_tokens():
    """Special tokens, added tokens written `<|name|>` or as markup, and vocabulary entries written `<|name|>` (a
    GGUF-converted Qwen tokenizer keeps <|fim_prefix|> there, not as an added token); an added run of spaces (Phi-2's,
    CodeGen's) or a vocabulary entry like `<div>` is text."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["[UNK]", "def", "<|fim_prefix|>", "<|file_sep|>", "<\uff5cfim\u2581begin\uff5c>", "<div>", "<|", "|>"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|endoftext|>")
    added = ("    ", "<tool_call>", "</tool_call>")
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    named = {tokenizer.convert_ids_to_tokens(i) for i in functional.control_token_ids(tokenizer)}
    assert named == {"[UNK]", "<|endoftext|>", *vocab[2:5], "<tool_call>", "</tool_call>"}


def test_html_tags_a_gguf_vocabulary_adds_as_user_defined_tokens_are_text_not_control_tokens():
    """Gemma's vocabulary holds HTML tags as user-defined tokens (gguf_vocab adds them `special: false`, matched whole
    in the text first): a program writing "<b>" writes that token, so a stop there cut code that builds HTML. Markup
    with an underscore (Gemma's <start_of_turn>) stays a control token."""
    from gguf import TokenType

    from pipeline.models.gguf_vocab import GgufVocab, spm_tokenizer
    from tiny_spm import spm_vocab

    base = spm_vocab()
    tags = ["<b>", "</b>", "<code>", "<table>", "<start_of_turn>"]
    vocab = GgufVocab(
        "llama",
        tuple(base.tokens + tags),
        tuple(base.scores + [0.0] * len(tags)),
        tuple(base.types + [int(TokenType.USER_DEFINED)] * len(tags)),
        (),
        bos=1,
        eos=2,
        unk=0,
        pad=None,
        add_bos=True,
        add_eos=False,
        add_space_prefix=True,
        chat_template=None,
    )
    tokenizer = spm_tokenizer(vocab)
    b = tokenizer.convert_tokens_to_ids("<b>")
    assert b in tokenizer(' return "<b>" + s')["input_ids"]  # what a model writes for the tag
    named = {tokenizer.convert_ids_to_tokens(i) for i in functional.control_token_ids(tokenizer)}
    assert named == {"<unk>", "<s>", "</s>", "<start_of_turn>"}
