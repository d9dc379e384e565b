"""params.yaml checked as a whole, once per `dvc repro`, by its always-run first stage (`sources`), and by the CLI:
every key as declared (pipeline/params/check.py: the schema generated from the concerns' declarations), then every
rule that reads more than one key, in one place: here.

`dvc repro` stops at its first stage with one line naming the param when a threshold is a string, an override names
no variant, a required gate is deleted or a version is a YAML float, rather than after hours of quantization and
training. The rules reach into every concern (recipes, hardware, thresholds, tiers, methods), so this module sits at
the top beside the CLI (pipeline/params imports no concern); only `sources` and the CLI import it, so those concerns
are not code deps of the stages that merely read params (pipeline/params/load.py).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.core.values import is_positive_int
from pipeline.models.settings import DraftSourceParams
from pipeline.models.sources import check_sources
from pipeline.params.check import check_schema
from pipeline.params.load import PARAMS_FILE, SECTIONS, read_yaml_mapping, refuse_other_params

if TYPE_CHECKING:
    from pipeline.serving.settings import ServingParams


def load_checked(path: str | Path = PARAMS_FILE, check_recipes: bool = True, checked: Path | None = None) -> dict:
    """params.yaml read and checked in full. check_recipes=False skips building each variant's recipe
    (compressed-tensors takes seconds to import), for commands that only read the gates, such as `modelprep gate`
    on a metrics directory. checked: a file remembering which recipe checks passed (see recipe_check_key): an
    unchanged set of variants is not checked again, a changed one is checked in full. Every other check runs
    every time."""
    refuse_other_params()
    path = Path(path)
    params = read_yaml_mapping(path, hint="; run from the project root")
    key = recipe_check_key(params) if check_recipes and checked is not None else None
    known = key is not None and key in passed_recipe_checks(checked)
    validate(params, path, check_recipes and not known)
    if key is not None and not known:
        remember_recipe_check(checked, key)
    return params


def recipe_check_remembered(path: str | Path = PARAMS_FILE, checked: Path | None = None) -> bool:
    """Whether load_checked(path, checked=checked) will skip the recipe check (an unchanged set of variants)."""
    try:
        key = recipe_check_key(read_yaml_mapping(Path(path)))
    except PipelineError:
        return False
    return checked is not None and key is not None and key in passed_recipe_checks(checked)


# Libraries the recipe check runs on: compressed-tensors' presets, pydantic validating its scheme models.
RECIPE_CHECK_LIBRARIES = ("compressed-tensors", "pydantic", "pydantic-core")


RECIPE_CHECKS_KEPT = 16  # a few params files (profiles, worktrees' tests) alternate without re-checking


def recipe_check_key(params: dict) -> str | None:
    """What the recipe part of validate (parse_variant of every variant, check_runs_on of the enabled ones) depends
    on: quantize.variants, quantize.enabled and serving.gpu as YAML gave them (repr tells 1 from '1' and True),
    every module of this package (its code may change what passes) and the libraries' versions. None when a
    library is missing: the full check then says so."""
    from importlib import metadata

    def get(section: str, key: str) -> object:
        node = params.get(section)
        return node.get(key, "<absent>") if isinstance(node, dict) else ("<not a mapping>", node)

    # Group sizes are checked against the target's and draft's layer widths: their sources (the demo's shapes) and
    # a local source's config.json are inputs too.
    # Each variant's tensor parallelism is decided with the recipes (parallelism.decide_enabled): its knobs too.
    inputs = (
        get("quantize", "variants"),
        get("quantize", "enabled"),
        get("serving", "gpu"),
        get("target", "source"),
        get("draft", "source"),
        params.get("demo"),
        *(
            get("serving", k)
            for k in (
                "tensor_parallel_size",
                "max_tensor_parallel_size",
                "max_num_seqs",
                "max_model_len",
                "gpu_memory_utilization",
                "tiers",
            )
        ),
    )
    digest = hashlib.sha256(repr(inputs).encode())
    for role in ("target", "draft"):
        source = get(role, "source")
        config = Path(str(source)).expanduser() / "config.json" if isinstance(source, str) else None
        if config is not None and config.is_file():
            digest.update(b"\0config\0" + config.read_bytes())
    package = Path(__file__).parent
    for module in sorted(package.rglob("*.py")):
        digest.update(f"\0{module.relative_to(package).as_posix()}\0".encode() + module.read_bytes())
    try:
        digest.update(repr([metadata.version(lib) for lib in RECIPE_CHECK_LIBRARIES]).encode())
    except metadata.PackageNotFoundError:
        return None
    return digest.hexdigest()


def passed_recipe_checks(checked: Path) -> list[str]:
    """The keys in `checked`; none when it is missing, corrupt or edited (a cache: then everything is checked)."""
    from pipeline.core.io import read_sealed_json

    try:
        keys = read_sealed_json(checked).get("passed")
    except (OSError, ValueError):
        return []
    return keys if isinstance(keys, list) and all(isinstance(k, str) for k in keys) else []


def remember_recipe_check(checked: Path, key: str) -> None:
    from pipeline.core.io import write_sealed_json

    keys = [key, *(k for k in passed_recipe_checks(checked) if k != key)][:RECIPE_CHECKS_KEPT]
    try:
        write_sealed_json(checked, {"passed": keys})
    except OSError:  # only the shortcut is lost
        pass


def _section(params: dict, dotted: str, path: Path) -> dict:
    node = params
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise PipelineError(f"{path}: {dotted} must be a mapping")
    return node


def validate(params, path: Path, check_recipes: bool = True) -> None:
    """Raise PipelineError naming the first bad param; no model or data is read. The checks run in this order, so
    the first error a user sees is the same whatever else is wrong."""
    typed = _parsed_whole(params, path)
    _check_no_secrets(params, path)
    variants = _section(params, "quantize.variants", path)
    specs = _checked_variants(params, typed, variants, path, check_recipes)
    # GPUs per replica, where the target's config is known here: a variant that can't fit fails now, not in serving.
    decided = tensor_parallel_sizes(
        params, {n: specs[n] for n in typed.quantize.enabled} if check_recipes else None, path
    )
    _check_gates(params, variants, path)
    _check_functional_tasks(params, path)
    draft_quant = _section(params, "draft_quantize", path).get("variant")
    if draft_quant is not None:
        _known([draft_quant], variants, "draft_quantize.variant", path)
    serving = _checked_names(params, path)
    check_serving(params, serving, variants, path, decided)
    _check_publish(params, typed, path)


def _parsed_whole(params, path: Path):
    """The file's shape, every key as declared, every section parsed as its stages read it, the sources."""
    if not isinstance(params, dict):
        raise PipelineError(f"{path}: expected a mapping of sections")
    missing = [s for s in SECTIONS if s not in params]
    if missing:
        raise PipelineError(f"{path}: missing sections {missing}")
    check_schema(params, path)  # every key as declared
    from pipeline.sections import Params

    typed = Params.parse(params, path)  # every section as its stages read it (the declarations' own rules too)
    check_sources(typed.target.source, DraftSourceParams(typed.draft.source).source, path)
    return typed


def _check_no_secrets(params, path: Path) -> None:
    from pipeline.core.redact import secret_paths

    leaked = secret_paths(params)
    if leaked:  # params land in dvc.lock, PROVENANCE.json and the logs
        raise PipelineError(
            f"{path}: {leaked[0]} holds a credential (user:password@ or a secret query parameter); "
            "params are recorded in dvc.lock and the bundle: give it in the environment instead "
            "(e.g. MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, "
            "MLFLOW_TRACKING_TOKEN, HF_TOKEN)"
        )


def _checked_variants(params, typed, variants: dict, path: Path, check_recipes: bool) -> dict:
    """name -> parsed VariantSpec (with check_recipes; else the names only), each enabled one checked against the
    serving GPU and the target's (and draft's) layer widths before any work."""
    from pipeline.core.names import check_variant_name

    specs = {}
    for name, raw in variants.items():
        try:
            if check_recipes:
                from pipeline.quantize.recipes import parse_variant

                specs[name] = parse_variant(name, raw)
            else:
                check_variant_name(name)
        except PipelineError as e:
            raise PipelineError(f"{path}: {e}") from None
    if not check_recipes:
        return specs
    from pipeline.quantize.hardware import check_runs_on

    enabled = list(typed.quantize.enabled)  # distinct, each a variant (QuantizeParams)
    gpu = _section(params, "serving", path).get("gpu")
    draft_variant = (params.get("draft_quantize") or {}).get("variant")
    try:
        for name in enabled:
            check_runs_on(specs[name], gpu)
        group_sizes(params, [specs[n] for n in enabled])  # layer widths against group sizes
        if draft_variant in specs:
            group_sizes(params, [specs[draft_variant]], role="draft")
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None
    return specs


def _check_gates(params, variants: dict, path: Path) -> None:
    from pipeline.release.thresholds import CHECKS, check_thresholds

    gates = _section(params, "gates", path)
    thresholds = _section(params, "gates.thresholds", path)
    check_thresholds(thresholds, f"{path}: gates.thresholds")
    required = sorted(k for k, c in CHECKS.items() if c.required and k not in thresholds)
    if required:
        raise PipelineError(
            f"{path}: gates.thresholds is missing required checks {required}; a release gate "
            "can't be dropped by deleting its threshold"
        )
    check_lm_eval_thresholds(
        params, [thresholds, *(v for v in (gates.get("overrides") or {}).values() if isinstance(v, dict))], path
    )
    overrides = gates.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise PipelineError(f"{path}: gates.overrides must map variant names to thresholds")
    _known(list(overrides), variants, "gates.overrides", path)
    for variant, values in overrides.items():
        if not isinstance(values, dict):
            raise PipelineError(f"{path}: gates.overrides.{variant} must be a mapping of thresholds")
        check_thresholds(values, f"{path}: gates.overrides.{variant}")
    allow_fail = gates.get("allow_fail") or []
    if not isinstance(allow_fail, list):
        raise PipelineError(f"{path}: gates.allow_fail must be a list of variant names")
    _known(allow_fail, variants, "gates.allow_fail", path)


def _check_functional_tasks(params, path: Path) -> None:
    tasks = (_section(params, "evaluate", path).get("functional") or {}).get("tasks")
    if isinstance(tasks, str):  # read (and each line checked) by evaluate, before models
        # under evals/ (a dependency of every evaluate stage): a task file elsewhere could change and re-run nothing
        if Path(tasks).is_absolute() or Path(tasks).parts[:1] != ("evals",) or ".." in Path(tasks).parts:
            raise PipelineError(
                f"{path}: evaluate.functional.tasks {tasks} must be a file under evals/ (the folder "
                "the evaluate stages depend on), e.g. evals/human-eval/functional.jsonl"
            )
        if not Path(tasks).is_file():
            raise PipelineError(f"{path}: evaluate.functional.tasks {tasks} not found")


def _checked_names(params, path: Path) -> dict:
    """serving.name, and the registry name publish gives each enabled variant: fail now, not after every bundle."""
    from pipeline.core.names import check_name

    serving = _section(params, "serving", path)
    _check_wrapped(check_name, serving.get("name"), "serving.name", path)
    for variant in params["quantize"]["enabled"]:
        published = f"{serving['name']}-{variant}"
        try:
            check_name(published)
        except PipelineError:
            raise PipelineError(
                f"{path}: serving.name: the registry name {published[:40]}... of variant {variant} "
                f"is {len(published)} characters, over the 128 allowed; shorten serving.name"
            ) from None
    return serving


def _check_publish(params, typed, path: Path) -> None:
    from pipeline.core.names import check_version

    registry = Path(str(params["publish"]["registry_dir"])).resolve()
    if paths.ARTIFACTS.resolve() in registry.parents or registry == paths.ARTIFACTS.resolve():
        raise PipelineError(
            f"{path}: publish.registry_dir {params['publish']['registry_dir']} is inside artifacts/, "
            "which the pipeline rebuilds (and whose bundles it copies): put the registry elsewhere"
        )
    for role, key in (params["publish"].get("signing") or {}).items():
        if key is not None and not Path(key).is_file():
            raise PipelineError(f"{path}: publish.signing.{role} {key} not found")
    version = typed.publish.version  # a string (release/settings.py: parse_version)
    if version != "auto":
        _check_wrapped(check_version, version, "publish.version", path)


def model_config(params: dict, role: str = "target"):
    """The transformers config of the target (or draft) as far as it is known before any stage runs: the demo's from
    demo.<role>, a local model directory's config.json, a Hub repo's config.json already in the local cache. None
    where it is not (or does not parse): the quantize stage then resolves group sizes on the loaded model."""
    import json

    from transformers import AutoConfig, LlamaConfig

    section = params.get(role) if isinstance(params.get(role), dict) else {}
    source = str(section.get("source"))
    try:
        if source == "demo":  # pipeline/models/demo/models.py's llama_config, from the same params
            demo = params["demo"]
            d = demo[role]
            return LlamaConfig(
                vocab_size=demo["vocab_size"],
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=d["num_attention_heads"],
                num_key_value_heads=d["num_key_value_heads"],
                tie_word_embeddings=False,
            )
        local = Path(source).expanduser() / "config.json"
        if local.is_file():
            found = local
        else:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source.removeprefix("hf:"), "config.json", revision=section.get("revision"))
            found = Path(cached) if isinstance(cached, str) else None
        if found is None:
            return None
        config = json.loads(found.read_text())
        return AutoConfig.for_model(config.pop("model_type"), **config)
    except Exception:  # noqa: BLE001 - an unreadable config is the sources/models stages' to report, with its file
        return None


def group_sizes(params: dict, specs: list, role: str = "target") -> dict:
    """variant name -> recipes.GroupSize of each grouped variant against the model's layer widths (config only, on
    the meta device); {} when the model's config is not known yet. Raises for a setting no layer width allows."""
    from pipeline.quantize.recipes import choose_group_size, config_input_widths, is_unquantized, scheme_for

    grouped = [
        s for s in specs if not is_unquantized(s) and (w := scheme_for(s).weights) is not None and w.strategy == "group"
    ]
    config = model_config(params, role) if grouped else None
    if config is None:
        return {}
    base = list((params["quantize"].get("calibration") or {}).get("ignore", ["lm_head"]))
    widths = {}  # per ignore list: the meta model is built once per list
    out = {}
    for spec in grouped:
        ignore = tuple(sorted(set(base) | set(spec.ignore)))
        if ignore not in widths:
            try:
                widths[ignore] = config_input_widths(config, list(ignore))
            except Exception:  # noqa: BLE001 - an architecture transformers can't build here: the stage checks it
                return {}
        out[spec.name] = choose_group_size(spec, widths[ignore])
    return out


def check_lm_eval_thresholds(params: dict, threshold_sets: list[dict], path: Path) -> None:
    """An lm-eval score bound must name a task that evaluate.lm_eval.tasks runs, or it could never pass."""
    from pipeline.release.thresholds import LM_EVAL_OPS, lm_eval_task_of

    tasks = (params.get("evaluate", {}).get("lm_eval") or {}).get("tasks") or []
    for thresholds in threshold_sets:
        for key in thresholds:
            if any(key.startswith(p) for p in LM_EVAL_OPS) and lm_eval_task_of(key, tasks) is None:
                raise PipelineError(
                    f"{path}: gate threshold {key} names no task of evaluate.lm_eval.tasks {tasks} "
                    "(min_lm_eval_<task>_<metric>)"
                )


def tensor_parallel_sizes(params: dict, specs: dict | None, path: Path) -> set[int]:
    """The tensor parallel sizes the enabled variants are served at, as far as known before any stage runs
    (pipeline/serving/parallelism.py): a pinned size, or each variant's decision from the target's config (the demo's,
    a local directory's, a cached Hub one's). specs: the enabled variants' parsed recipes; None when the recipe check
    is skipped (remembered), then parsed here (parse_variant is cheap: no compressed-tensors), so a second run
    decides as the first did. Empty when auto can't be decided yet (the models stage does). One line when a variant
    can't fit."""
    from pipeline.serving.settings import AUTO_TP, ServingParams

    pinned = (params.get("serving") or {}).get("tensor_parallel_size")
    fallback = {pinned} if pinned != AUTO_TP and is_positive_int(pinned) else set()
    if specs is None:
        specs = enabled_specs(params)
        if specs is None:
            return fallback
    from pipeline.serving import parallelism
    from pipeline.serving.sharding import with_calibration_ignore

    config = parallelism.source_config(params)
    specs = {n: with_calibration_ignore(s, params) for n, s in specs.items()}  # the layers it leaves unquantized
    try:
        decisions = parallelism.decide_enabled(ServingParams.parse(params["serving"]), specs, config)
        parallelism.evaluate_sizes(params, decisions, specs, config)  # evaluate's engines fit their own share
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None
    return {d.tensor_parallel_size for d in decisions.values()} or fallback


def enabled_specs(params: dict) -> dict | None:
    """The enabled variants' VariantSpecs, or None where one doesn't parse (the recipe check, when it runs, says
    why: here the sizes are only unknown)."""
    from pipeline.quantize.recipes import variant_spec

    try:
        return {n: variant_spec(params["quantize"]["variants"], n) for n in params["quantize"]["enabled"]}
    except PipelineError:
        return None


def check_serving(params: dict, serving: dict, variants: dict, path: Path, tp_sizes: set[int] | None = None) -> None:
    """The serving section and the serving benchmark's settings (no GPU or model needed). tp_sizes: the tensor
    parallel sizes the variants were decided at (tensor_parallel_sizes); the tiers are checked at each. When none is
    known yet (auto, the config not readable before the models stage), at undecided_tp's stand-in: what depends on
    the size is checked again by the stages that parse the tiers at the variant's size (evaluate, serve_bench,
    bundle; not models, which stays fresh when the tiers change: tests/project/test_dvc_graph.py)."""
    _known([serving.get("baseline_variant")], variants, "serving.baseline_variant", path)
    profile = params["serving"]["speculation"].get("cost_profile", "auto")
    if profile.endswith(".json") and not Path(profile).is_file():
        raise PipelineError(f"{path}: serving.speculation.cost_profile: {profile} not found")
    env = serving.get("env") or {}
    # Values end up in serve.env (`env $(cat serve.env) vllm serve`), Kubernetes env and the benchmark's server:
    # no whitespace, quotes or shell metacharacters that one of them would split or expand.
    value = re.compile(r"^[A-Za-z0-9_.,:=/@+%-]*$")
    if not isinstance(env, dict) or not all(
        isinstance(k, str)
        and k.isidentifier()
        and isinstance(v, (str, int))
        and not isinstance(v, bool)
        and value.match(str(v))
        for k, v in env.items()
    ):
        raise PipelineError(
            f"{path}: serving.env must map environment variable names to plain values (letters, "
            f"digits and _.,:=/@+%-), got {env!r}"
        )
    from pipeline.core.redact import _secret_key

    secret_named = sorted(k for k in env if _secret_key(k))
    if secret_named:
        raise PipelineError(
            f"{path}: serving.env.{secret_named[0]} looks like a secret: its value would ship in clear "
            f"in serve.env and the manifests; name a Kubernetes Secret instead, serving.secret_env: "
            f"{{{secret_named[0]}: <secret-name>/<key>}}"
        )
    secrets = serving.get("secret_env") or {}
    ref = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[-._a-zA-Z0-9]{1,253}$")
    if not isinstance(secrets, dict) or not all(
        isinstance(k, str) and k.isidentifier() and isinstance(v, str) and ref.match(v) for k, v in secrets.items()
    ):
        raise PipelineError(
            f"{path}: serving.secret_env must map environment variable names to "
            "<kubernetes-secret-name>/<key> references"
        )
    from pipeline.serving.parallelism import resolved
    from pipeline.serving.settings import ServingParams

    try:
        typed = ServingParams.parse(serving)  # what the tiers are parsed from (each tier's slo: parse_tiers)
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None
    for tp in sorted(tp_sizes or {undecided_tp(typed)}):
        each = resolved(typed, tp) if isinstance(typed.tensor_parallel_size, str) else typed
        check_serve_bench(_section(params, "serve_bench", path), each, path)
        check_handoff(params, each, path)


def undecided_tp(serving: ServingParams) -> int:
    """The stand-in size for tiers checked before auto is decided: the draft's tensor parallelism where it is set
    (the default tier speculates, so the only size a valid file can decide), else 1 (then nothing checked depends on
    it: a tier inheriting 1 fits any GPU count). Never a made-up size the draft's is compared with."""
    return serving.speculation.draft_tensor_parallel_size or 1


def check_handoff(params: dict, serving: ServingParams, path: Path) -> None:
    """Serving tiers, deployment manifests and monitoring: the bundle stage's inputs, checked up front."""
    from pipeline.serving.tiers import parse_tiers, select

    deploy = _section(params, "deploy", path)
    try:
        tiers = parse_tiers(serving)
        deployed = {t.name for t in select(tiers, deploy.get("tiers"))}
        check_autoscale(deploy, tiers, deployed)
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None


def check_autoscale(deploy: dict, tiers: list, deployed: set[str]) -> None:
    """deploy.autoscale: the tiers sized from the measured capacity, each one deploy.tiers renders (its autoscaler
    scales that Deployment)."""
    from pipeline.serving.tiers import select

    cfg = deploy["autoscale"]
    if cfg.get("tiers") != []:
        names = [t.name for t in select(tiers, cfg.get("tiers"), "deploy.autoscale.tiers")]
        undeployed = [n for n in names if n not in deployed]
        if undeployed:
            raise PipelineError(
                f"deploy.autoscale.tiers names {undeployed}, which deploy.tiers does not render: an "
                "autoscaler needs the tier's Deployment"
            )


def check_serve_bench(cfg: dict, serving: ServingParams, path: Path) -> None:
    """serve_bench against serving: the target concurrency is measured, the tiers served exist."""
    levels = cfg["concurrency"]
    target = serving.target_concurrency
    if target not in levels:
        raise PipelineError(
            f"{path}: serving.target_concurrency ({target!r}) must be one of serve_bench.concurrency "
            f"{levels}: the speculative setting is chosen from a measurement at it"
        )
    from pipeline.serving.tiers import benchmarked

    try:
        benchmarked(serving, cfg.get("tiers", []))
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None


def _known(names: list, variants: dict, param: str, path: Path) -> None:
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise PipelineError(f"{path}: {param} names unknown variants {unknown}; known: {sorted(variants)}")


def _check_wrapped(check, value, param: str, path: Path) -> None:
    if not isinstance(value, str):
        raise PipelineError(f"{path}: {param} must be a string, got {value!r}")
    try:
        check(value)
    except PipelineError as e:
        raise PipelineError(f"{path}: {param}: {e}") from None


def say_group_sizes(p: dict) -> None:
    """The sources stage's report: each enabled variant whose group size was changed for the target's layer widths,
    and why. pipeline.quantize.recipes imports compressed-tensors (seconds): only when the recipe check runs."""
    from pipeline.core.stage import say
    from pipeline.params.load import parse_section
    from pipeline.quantize.recipes import group_size_label, variant_spec
    from pipeline.quantize.settings import QuantizeParams

    quantize = parse_section(p, QuantizeParams)
    specs = [variant_spec(quantize.variants, v) for v in quantize.enabled]
    for name, group in group_sizes(p, specs).items():
        if group.reason:
            say(
                f"sources: quantize {name}: group_size {group.configured} -> {group_size_label(group.used)} "
                f"({group.reason})"
            )
