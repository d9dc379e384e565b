"""A scratch directory holding what the bundle and publish stages read, built from the tiny demo pair.

Evaluation numbers are inputs here (the evaluate stage has its own tests); the gate verdict and the
chosen num_speculative_tokens are computed by the pipeline's own code from them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eval_helpers import eval_summary
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.quantize.recipes import parse_variant
from pipeline.release.bundle import CardInputs, model_card
from pipeline.release.decision import SpeculationDecision
from pipeline.release.gates import VariantVerdict
from pipeline.serving.bench_record import ServeBenchRecord
from speculation_estimates import TOKEN_ACCEPTANCE, speculative_estimate
from tiny_project import ROOT, merge, tiny_params, tiny_serving

MODELPREP = str(Path(sys.executable).parent / "modelprep")
PASSING = {
    "perplexity_baseline": 1.31,
    "perplexity": 1.32,
    "perplexity_increase_pct": 0.76,
    "kl_divergence": 0.004,
    "top1_agreement": 0.97,
    "greedy_match": 0.9,
    "token_acceptance": TOKEN_ACCEPTANCE,
    "lm_eval_domain_heldout_acc": 0.41,
}


def stage_workspace(root: Path, demo_pair: tuple[Path, Path], variants: dict[str, dict], **overrides) -> Path:
    """variants: name -> metric overrides (e.g. a KL that fails its gate). Returns root."""
    from eval_helpers import gate_report
    from pipeline.core import records
    from pipeline.core.io import read_json, write_json
    from pipeline.data.formatting import row_to_messages
    from pipeline.evaluate.summary import EvalSummary
    from pipeline.serving.bench_record import ServeBenchRecord

    target, draft = demo_pair
    # One request at a time by default: where a predicted speculative setting holds, so the bundles carry one
    params = tiny_params(quantize={"enabled": list(variants)}, **merge({"serving": {"max_num_seqs": 1}}, overrides))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copytree(draft, root / "artifacts/draft/model")
    spec = speculative_estimate()
    summaries = {}
    for variant, metric_overrides in variants.items():
        model = root / "artifacts/quantized" / variant
        shutil.copytree(target, model)
        config = read_json(model / "config.json")
        # The key llm-compressor writes into a compressed-tensors checkpoint's config.json.
        config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized"}
        write_json(model / "config.json", config)
        summaries[variant] = EvalSummary.from_metrics(
            {
                "variant": variant,
                **PASSING,
                "estimated_num_speculative_tokens": spec.num_speculative_tokens,
                "accepted_per_draft_token": spec.accepted_per_draft_token,
                "estimated_speedup": spec.expected_speedup,
                "cost_profile": "test-profile",
                # as evaluate predicts it at every declared concurrency (tiers at 1 and 64)
                "estimated_speedup_by_concurrency": [
                    {"concurrency": 1, "speedup": spec.expected_speedup},
                    {"concurrency": 64, "speedup": 1.02},
                ],
                **metric_overrides,
            },
            variant,
        )
        ev = root / "artifacts/eval" / variant
        summaries[variant].write(ev / "summary.json")
        records.write(ev / "speculative.json", spec)
        write_json(ev / "vllm.json", {"skipped": "no CUDA device"})
        records.write(
            root / "artifacts/serve" / variant / "record.json", ServeBenchRecord(variant, skipped="no CUDA device")
        )
        write_json(
            root / f"metrics/quantize-{variant}.json",
            {"variant": variant, "size_before_mb": 1.2, "size_after_mb": 0.7, "compression_ratio": 1.71},
        )
    write_json(root / "metrics/models.json", {"source": "demo"})
    heldout = root / "artifacts/data/heldout.jsonl"  # the demo traffic's first conversations (warm-up prompts)
    heldout.parent.mkdir(parents=True, exist_ok=True)
    rows = (ROOT / "data/demo/traffic.jsonl").read_text().splitlines()[:12]
    heldout.write_text("".join(json.dumps({"messages": row_to_messages(json.loads(r))}) + "\n" for r in rows))
    # what the attestation names (the bundle stage's deps): the base model, the calibration and draft-training data
    shutil.copytree(target, root / "artifacts/models/target")
    for split, part in (("calibration", rows[:6]), ("draft_train", rows[6:])):
        (root / f"artifacts/data/{split}.jsonl").write_text(
            "".join(json.dumps({"messages": row_to_messages(json.loads(r))}) + "\n" for r in part)
        )
    write_json(root / "artifacts/sources.json", {"target": {"kind": "demo"}, "draft": {"kind": "demo"}})
    records.write(root / "artifacts/gate/verdict.json", gate_report(params, summaries))
    return root


@dataclass(frozen=True)
class BundleSpec:
    """What a bundled workspace holds: variants (name -> metric overrides, as stage_workspace takes them), the
    params overrides, the variants the bundle stage builds (None: all of them) and text its output must say."""

    variants: dict[str, dict]
    overrides: dict = field(default_factory=dict)
    bundled: tuple[str, ...] | None = None
    says: str = ""


def bundle_workspace(root: Path, demo_pair: tuple[Path, Path], spec: BundleSpec) -> Path:
    """stage_workspace(root, ...) and the real bundle stage run for each bundled variant, each checked to succeed."""
    ws = stage_workspace(root, demo_pair, spec.variants, **spec.overrides)
    for variant in spec.variants if spec.bundled is None else spec.bundled:
        r = run_stage(ws, "stages.bundle", variant)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"bundle {variant}:" in r.stdout and spec.says in r.stdout, r.stdout[-3000:]
    return ws


def free_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_stage(cwd: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m stages.<name> ...` as DVC runs it, from a scratch project directory."""
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def run_stage_in_process(cwd: Path, capfd, module: str, *argv: str) -> subprocess.CompletedProcess:
    """run_stage without a new interpreter: the stage's real main (stage_main's log file, console lines and exit
    code) called in this process from cwd, so a test running stages several times pays their imports once.
    capfd: pytest's fixture; the result's stdout and stderr are what the stage wrote to the console."""
    import contextlib
    import importlib
    import logging

    main = importlib.import_module(module).main
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # stage_main points logging at its log file
    capfd.readouterr()  # what the test wrote before is not the stage's
    try:  # sys.stdout and sys.stderr on fds 1 and 2, as in a stage's process: its redirect to the log takes them too
        with (
            contextlib.chdir(cwd),
            open(1, "w", buffering=1, closefd=False) as out,
            open(2, "w", buffering=1, closefd=False) as err,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            main(list(argv))
    except SystemExit as e:
        code = e.code
    else:
        raise AssertionError(f"{module}.main returned instead of exiting with the stage's code")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    console = capfd.readouterr()
    return subprocess.CompletedProcess([module, *argv], code, console.out, console.err)


def verify_cli(bundle: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MODELPREP, "verify", str(bundle)], capture_output=True, text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The stage/CLI contract for bad input: exit 2 and exactly one `error: ...` line on stderr."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    return lines[0]


def render_card(variant: str, gpu: VllmMeasurement, serve: ServeBenchRecord, quant: dict | None = None) -> str:
    """The card of params.yaml's `variant` from these GPU records (and quantize metrics), with passing numbers for
    the rest."""
    return card_of(variant, speculative_estimate(), gpu, serve, quant=quant)


def card_of(
    variant: str,
    est,
    gpu: VllmMeasurement,
    serve: ServeBenchRecord,
    *,
    quant: dict | None = None,
    speedup: float = 2.0,
    top1_agreement: float = 1.0,
    **summary,
) -> str:
    """The card of params.yaml's `variant` with speculative estimate `est` shipped at `speedup`, these GPU records,
    and a passing evaluation summary (its fields overridden by `summary`)."""
    return model_card(
        CardInputs(
            variant,
            parse_variant(variant, tiny_params()["quantize"]["variants"][variant]),
            eval_summary(
                {
                    "perplexity_baseline": 1.0,
                    "perplexity": 1.0,
                    "perplexity_increase_pct": 0.0,
                    "kl_divergence": 0.0,
                    "top1_agreement": top1_agreement,
                    "greedy_match": 1.0,
                    **summary,
                }
            ),
            est,
            VariantVerdict(
                passed=True,
                allowed_failure=False,
                speculation=SpeculationDecision(
                    est.num_speculative_tokens,
                    est.num_speculative_tokens,
                    "estimated",
                    speedup,
                    None,
                    "test",
                    method=est.method,
                ),
            ),
            quant or {"size_before_mb": 2, "size_after_mb": 1, "compression_ratio": 2},
            tiny_serving(name="svc"),
            gpu,
            serve,
        )
    )
