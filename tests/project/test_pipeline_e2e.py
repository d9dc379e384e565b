"""The whole pipeline through real `dvc repro` in a throwaway copy of the project."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml

from tiny_project import ROOT, copy_project, run, tiny_params

pytestmark = pytest.mark.slow
LOCKS = ("dvc.lock", "stages/dvc.lock")  # dvc.yaml's, and stages/dvc.yaml's (the always-run `sources`)


@pytest.fixture(scope="module")
def first_build(tmp_path_factory):
    """The project after its first `dvc repro`, and the locks that build wrote (later tests re-run stages)."""
    proj = copy_project(tmp_path_factory.mktemp("project"))
    r = run(["dvc", "repro"], proj)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return proj, {lock: (proj / lock).read_text() for lock in LOCKS}


@pytest.fixture(scope="module")
def project(first_build):
    return first_build[0]


def stages_run(output: str) -> list[str]:
    """The stages a `dvc repro` ran, by name (DVC prefixes one of another pipeline file: stages/dvc.yaml:sources)."""
    return [line.split("'")[1].rsplit(":", 1)[-1] for line in output.splitlines() if line.startswith("Running stage")]


def test_repro_publishes_every_variant(project):
    params = tiny_params()
    index = json.loads((project / "registry" / "index.json").read_text())
    for variant in params["quantize"]["enabled"]:
        name = f"{params['serving']['name']}-{variant}"
        latest = index["models"][name]["latest"]
        bundle = project / "registry" / name / latest
        assert (bundle / "model" / "config.json").is_file()
        serve = yaml.safe_load((bundle / "serve.yaml").read_text())
        assert serve["model"] == "./model"
        # The speculative setting the gate decided ships, and nothing else: the draft with its k, or neither.
        k = json.loads((bundle / "GATE.json").read_text())["speculation"]["num_speculative_tokens"]
        assert (bundle / "draft" / "config.json").is_file() == bool(k)
        if k:
            assert serve["speculative-config"] == {
                "method": "draft_model",
                "model": "./draft",  # a YAML mapping
                "num_speculative_tokens": k,
            }
        else:
            assert "speculative-config" not in serve
        assert run(["modelprep", "verify", str(bundle)], project).returncode == 0
    gates = json.loads((project / "metrics" / "gates.json").read_text())
    assert gates["all_passed"] is True and gates["variants_failed"] == 0 and gates["published_with_failures"] == []
    draft = json.loads((project / "metrics" / "draft.json").read_text())
    assert draft["token_acceptance_finetuned"] > draft["token_acceptance_untrained"], draft


def test_eval_metrics_are_the_summary_gate_bundle_and_publish_read(project, tmp_path):
    """evaluate writes its summary as a typed record (artifacts/eval/<v>/summary.json, what the gate and the bundle
    read); metrics/eval-<v>.json is that record's to_metrics(), byte for byte, and reads back as it, and so does the
    published bundle's EVAL.json (what publish reads)."""
    from pipeline.core.io import write_json
    from pipeline.drafts import methods
    from pipeline.evaluate.summary import EvalSummary, load_metrics
    from pipeline.release.publish import EvalRecord

    params = tiny_params()
    index = json.loads((project / "registry" / "index.json").read_text())
    for variant in params["quantize"]["enabled"]:
        summary = EvalSummary.load(project / f"artifacts/eval/{variant}/summary.json")
        assert summary.variant == variant and summary.quality.tokens and summary.lm_eval
        assert [m.method for m in summary.speculation.methods] == methods.requested(params)
        metrics = project / f"metrics/eval-{variant}.json"
        write_json(tmp_path / metrics.name, summary.to_metrics())
        assert (tmp_path / metrics.name).read_bytes() == metrics.read_bytes()
        assert load_metrics(metrics) == summary
        name = f"{params['serving']['name']}-{variant}"
        bundle = project / "registry" / name / index["models"][name]["latest"]
        assert EvalRecord.from_json(json.loads((bundle / "EVAL.json").read_text()), "EVAL.json").summary == summary


def compare_locks():
    spec = importlib.util.spec_from_file_location("compare_locks", ROOT / "benchmarks" / "cpu" / "compare_locks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Every stage up to one variant's evaluation: models, data, a GPTQ variant, the draft's distillation, fine-tune and
# serving copy, the EAGLE-3 head, and evaluate (bundles record the build's git commit, which differs between clones).
REBUILT = "evaluate@gptq-w4a16"


def test_a_second_build_reproduces_every_output_bit_for_bit(first_build, tmp_path):
    """Issue #32: a fresh copy of the same code and params, built again on the same machine, writes outputs and
    metrics identical to the first build's (dvc.lock's md5 of each), so a committed lock is one anybody rebuilds.
    --no-run-cache: DVC must run every stage, not restore a cached run."""
    _, first_locks = first_build
    second = copy_project(tmp_path)
    r = run(["dvc", "repro", "--no-run-cache", REBUILT], second)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    differ = {
        stage: paths
        for lock in LOCKS
        for stage, paths in compare_locks().differing_outputs(first_locks[lock], (second / lock).read_text()).items()
    }
    assert len(differ) >= 9 and {"sources", REBUILT} <= set(differ), sorted(differ)  # the whole slice ran
    assert not {stage: paths for stage, paths in differ.items() if paths}, "outputs differ between two builds"
    # The run-dependent numbers went to artifacts/timings, outside what DVC hashes; the console still shows them.
    assert json.loads((second / "artifacts" / "timings" / "quantize-gptq-w4a16.json").read_text())["wall_time_s"] > 0
    assert "wall_time_s" not in (second / "metrics" / "quantize-gptq-w4a16.json").read_text()
    assert "quantize gptq-w4a16: " in r.stdout and "eagle3: 20 steps in " in r.stdout


def test_console_shows_pipeline_lines_and_library_noise_goes_to_logs(project):
    r = run(["dvc", "repro", "--force", "--single-item", "gate"], project)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "gate " in r.stdout and "PASS" in r.stdout
    logs = {p.name for p in (project / "artifacts" / "logs").iterdir()}
    assert {"models.log", "data.log", "distill.log", "draft_finetune.log", "gate.log"} <= logs
    assert any(name.startswith("quantize@") for name in logs)
    assert "GPTQ" not in r.stdout + r.stderr  # llm-compressor's METRIC lines stay in the log files


def test_metrics_are_committed_the_dvc_way(project):
    """metrics/ is tracked by git (not ignored), so `dvc metrics diff` compares a change with HEAD."""
    for cmd in (["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "build"]):
        assert run(cmd, project).returncode == 0
    r = run(["dvc", "metrics", "diff", "--json"], project)
    assert r.returncode == 0 and "failed to load" not in r.stderr, r.stderr
    # Issue #49: the table a build leaves is the gate's headline, one column per variant, readable in a terminal
    r = run(["dvc", "metrics", "show"], project)
    assert r.returncode == 0 and "failed to load" not in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 120 and lines[0].split() == ["Path", *sorted(tiny_params()["quantize"]["enabled"])]
    assert {line.split("/")[1] for line in lines[1:]} == {"quality", "release", "speed"}, r.stdout


def test_dvc_plots_leave_out_the_serving_curves_serve_bench_skipped(project):
    """`dvc plots show` renders every plot with data, without errors; without a GPU serve_bench measured nothing, so
    its chart directories hold only the note saying why and no serving chart is drawn (not one drawn empty)."""
    r = run(["dvc", "plots", "show", "--json"], project)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert not shown.get("errors"), shown.get("errors")
    assert not [name for name in shown["data"] if name.startswith("plots/serve_")]
    for variant in tiny_params()["quantize"]["enabled"]:
        assert f"plots/acceptance-{variant}.csv" in shown["data"]
        for chart in ("serve_itl", "serve_throughput", "serve_pareto"):
            skipped = (project / "plots" / chart / variant / "skipped.txt").read_text()
            assert skipped.startswith(f"serve_bench {variant}: ")
    assert all(plot["content"]["data"]["values"] for plots in shown["data"].values() for plot in plots)


def test_second_repro_is_a_noop(project):
    r = run(["dvc", "repro"], project)
    assert r.returncode == 0
    assert stages_run(r.stdout) == ["sources"]  # always fingerprints the model sources; nothing else is stale


def stale_after(project, edit) -> set[str]:
    """The stages `dvc status` finds changed after editing params.yaml (their downstream follows)."""
    path = project / "params.yaml"
    before = path.read_text()
    params = yaml.safe_load(before)
    edit(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        r = run(["dvc", "status", "--json"], project)
        assert r.returncode == 0, r.stderr
        return set(json.loads(r.stdout)) - {"stages/dvc.yaml:sources"}  # always changed: it fingerprints the sources
    finally:
        path.write_text(before)


def test_params_invalidate_only_the_stages_that_read_them(project):
    # publish re-checks each verdict against the thresholds in force, so it reads them too; each variant's per-layer
    # search walks to its quality thresholds, so it reads them: a variant without `mixed:` writes the same note again
    # and its quantize@ stays fresh (dvc status lists a stage whose own params changed, not what follows)
    enabled = tiny_params()["quantize"]["enabled"]
    assert stale_after(project, lambda p: p["gates"]["thresholds"].update(max_kl_divergence=0.049)) == {
        "gate",
        "publish",
        *(f"mixed@{v}" for v in enabled),
    }
    # A GPTQ knob: that variant's quantize and bundle (its card states the recipe), the gate (which knows
    # the variants) and the served-draft stage (which can quantize the draft with any variant's recipe;
    # with none set it copies, so nothing after it changes). Never the distillation or the fine-tune.
    stale = stale_after(project, lambda p: p["quantize"]["variants"]["gptq-w4a16"].update(dampening_frac=0.02))
    assert stale == {
        "mixed@gptq-w4a16",
        "quantize@gptq-w4a16",
        "serve_bench@gptq-w4a16",
        "bundle@gptq-w4a16",
        "draft_quantize",
        "gate",
    }, stale
    assert stale_after(project, lambda p: p["draft_training"].update(epochs=3)) == {"draft_finetune"}
    # Serving settings change what is served: the serving benchmark measures it again, and the bundles ship it; the
    # gate reads the batch limit too (a predicted speculation ships only for one request at a time). The batch limit
    # sizes the KV cache, so it can change each variant's GPUs per replica (serving.tensor_parallel_size auto):
    # evaluate's vLLM engines run at least at that size and distill's at the target's, so they read it too.
    assert stale_after(project, lambda p: p["serving"].update(max_num_seqs=8)) == {"gate", "distill"} | {
        f"{stage}@{v}" for v in tiny_params()["quantize"]["enabled"] for stage in ("evaluate", "serve_bench", "bundle")
    }
    # A decision threshold re-decides from the same measurements: nothing is benchmarked again.
    assert stale_after(project, lambda p: p["serving"]["speculation"].update(min_gain=1.5)) == {
        "gate",
        *(f"bundle@{v}" for v in tiny_params()["quantize"]["enabled"]),
    }


def test_failed_gate_fails_repro_naming_the_check(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["gates"]["thresholds"]["min_top1_agreement"] = 1.01  # unreachable
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = run(["dvc", "repro"], project)
    assert r.returncode != 0
    assert "min_top1_agreement" in r.stderr + r.stdout
    report = json.loads((project / "metrics" / "gates.json").read_text())
    assert report["all_passed"] is False and report["blocked"]
    # Running publish by hand after the failure publishes nothing: the bundles on disk are from
    # another gate run than the current (failed) one.
    index = (project / "registry" / "index.json").read_text()
    r = run([sys.executable, "-m", "stages.publish"], project)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "another gate run" in r.stderr, r.stderr
    assert (project / "registry" / "index.json").read_text() == index


def test_the_functional_check_runs_in_the_evaluate_stage_and_its_drop_is_gated(project):
    """evaluate.functional.tasks set: the evaluate stage writes each task's outcome, pass@1 of the target and the
    variant into its summary and metrics, and the gate applies max_pass_at_1_drop to it (last: it edits params)."""
    tasks = [
        {
            "task_id": "E2E/0",
            "prompt": 'def add(a, b):\n    """a + b"""\n',
            "canonical_solution": "    return a + b\n",
            "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
            "entry_point": "add",
        }
    ]
    (project / "evals" / "functional.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["evaluate"]["functional"].update(tasks="evals/functional.jsonl", max_new_tokens=8)
    params["gates"]["thresholds"]["max_pass_at_1_drop"] = 0.0
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # the baseline recorded before these tasks were set is refused, one line naming it
    r = run([sys.executable, "-m", "stages.evaluate", "gptq-w4a16"], project)
    assert r.returncode != 0 and "artifacts/functional/baseline.json: tasks_file None" in r.stderr, r.stderr[-2000:]
    r = run([sys.executable, "-m", "stages.functional_baseline"], project)
    assert r.returncode == 0 and "functional_baseline: pass@1" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    baseline = json.loads((project / "artifacts" / "functional" / "baseline.json").read_text())["baseline"]
    for variant in ("bf16", "gptq-w4a16"):
        r = run([sys.executable, "-m", "stages.evaluate", variant], project)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        record = json.loads((project / "artifacts" / "eval" / variant / "functional.json").read_text())
        assert record["tasks_file"] == "evals/functional.jsonl" and len(record["variant"]["results"]) == 1
        metrics = json.loads((project / "metrics" / f"eval-{variant}.json").read_text())
        assert metrics["functional_tasks"] == 1
        assert metrics["pass_at_1_drop"] == metrics["pass_at_1_baseline"] - metrics["pass_at_1"]
        assert record["baseline"] == baseline  # every variant against the one recorded run
    run([sys.executable, "-m", "stages.gate"], project)
    verdict = json.loads((project / "artifacts" / "gate" / "verdict.json").read_text())
    for variant in ("bf16", "gptq-w4a16"):
        check = next(c for c in verdict["variants"][variant]["checks"] if c["check"] == "max_pass_at_1_drop")
        assert check["value"] is not None and check["skipped"] is None
    # fp8-static was not re-evaluated: no functional numbers, so the check is skipped saying why
    check = next(c for c in verdict["variants"]["fp8-static"]["checks"] if c["check"] == "max_pass_at_1_drop")
    assert check["passed"] is None and "evaluate.functional.tasks is not set" in check["skipped"]
