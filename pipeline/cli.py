"""`modelprep`: run the pipeline, see where it stands, verify bundles, gate metrics from elsewhere."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pipeline.errors import PipelineError


def cmd_run(args) -> int:
    """`dvc repro` with the given targets; DVC decides what is stale."""
    return subprocess.call(["dvc", "repro", *(["--force"] if args.force else []), *args.targets])


def cmd_status(args) -> int:
    """Stale stages (dvc status), gate verdicts and what the local registry holds."""
    from pipeline.config import load_params
    from pipeline.registry.local import read_index

    rc = subprocess.call(["dvc", "status"])
    verdict = Path("artifacts/gate/verdict.json")
    if verdict.exists():
        for variant, v in json.loads(verdict.read_text())["variants"].items():
            print(f"gate {variant}: {'pass' if v['passed'] else 'FAIL'}")
    registry = Path(load_params()["publish"]["registry_dir"])
    for name, entry in read_index(registry)["models"].items():
        print(f"registry {name}: latest {entry['latest']} ({len(entry['versions'])} versions)")
    return rc


def cmd_verify(args) -> int:
    from pipeline.manifest import verify

    manifest = verify(args.bundle)
    print(f"ok: {args.bundle}: {len(manifest['files'])} files match MANIFEST.json "
          f"(digest {manifest['bundle_digest'][:12]})")
    return 0


def cmd_gate(args) -> int:
    """The `gate` stage's checks on metrics produced anywhere (e.g. a GPU runner)."""
    from pipeline import gates
    from pipeline.config import load_params

    params = load_params(args.params)
    report = gates.run(params, gates.load_eval_metrics(args.metrics_dir, args.variants or None), args.allow_fail)
    return gates.conclude(report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelprep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline (dvc repro)", description=cmd_run.__doc__)
    run.add_argument("targets", nargs="*", help="stages to reproduce (default: all)")
    run.add_argument("--force", action="store_true", help="re-run even if nothing changed")
    run.set_defaults(func=cmd_run)
    status = sub.add_parser("status", help="what is stale, gate verdicts, registry contents",
                            description=cmd_status.__doc__)
    status.set_defaults(func=cmd_status)
    verify = sub.add_parser("verify", help="re-hash a bundle against its MANIFEST.json",
                            description="Exit 0 when every file matches its sha256; 2 naming the first mismatch.")
    verify.add_argument("bundle", help="bundle directory")
    verify.set_defaults(func=cmd_verify)
    gate = sub.add_parser("gate", help="check eval metrics against params.yaml thresholds", description=cmd_gate.__doc__)
    gate.add_argument("--metrics-dir", required=True, help="directory holding eval-<variant>.json files")
    gate.add_argument("--params", default="params.yaml", help="params file with the gates section")
    gate.add_argument("--variant", dest="variants", action="append", help="gate only these variants (repeatable)")
    gate.add_argument("--allow-fail", action="append", default=[], metavar="VARIANT",
                      help="do not fail on this variant's gates (it is flagged in its card)")
    gate.set_defaults(func=cmd_gate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args))
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
