"""Stage `sources` (always runs): fingerprints of the target and draft sources, so that `models`
re-runs when a local model directory is edited in place or a Hub revision moves, and only then.
Being first in every `dvc repro`, it is also where the whole params.yaml is checked, recipes included, and
where a GGUF source (`smollm2`, a .gguf file) is converted on first use (cached: pipeline/models/gguf_source.py).

It runs on every `dvc repro`, so an unchanged workspace must cost little: a local model's files are read only
when their stat changed (HashCache), and the recipe check, which imports compressed-tensors and torch (seconds),
only when the variants, the code or the libraries changed. Both memories live in artifacts/cache/: gitignored,
one per workspace (inodes and times are this machine's), dropped with the rest of artifacts/, and not DVC
outputs (DVC deletes a stage's outputs before running it). Deleting them costs one slow run, never a wrong hash."""

from pipeline.core import paths
from pipeline.core.io import write_json
from pipeline.core.stage import say, stage_main, warn
from pipeline.models.settings import DraftSourceParams, TargetParams
from pipeline.models.sources import HashCache, describe_fingerprint, source_fingerprint
from pipeline.params.load import parse_section
from pipeline.release.settings import PublishParams
from pipeline.release.signing import KEY_HASHES, key_identities
from pipeline.rules import load_checked, recipe_check_remembered, say_group_sizes
from pipeline.serving.plan_check import resource_plan

HASHES = paths.CACHE / "source-hashes.json"
RECIPES_CHECKED = paths.CACHE / "recipes-checked.json"


@stage_main()
def main(argv: list[str]) -> None:
    remembered = recipe_check_remembered(checked=RECIPES_CHECKED)
    p = load_checked(checked=RECIPES_CHECKED)
    cache = HashCache(HASHES)
    if cache.problem:
        warn(f"sources: ignored {HASHES} ({cache.problem}); every model file is read again")
    target, draft = parse_section(p, TargetParams), parse_section(p, DraftSourceParams)
    prints = {
        "target": source_fingerprint(target.source, "target", target.revision, cache),
        "draft": source_fingerprint(draft.source, "draft", cache=cache),
    }
    if problem := cache.save():
        warn(f"sources: {problem}; the next run reads every model file again")
    write_json(paths.SOURCES, prints)
    keys = parse_section(p, PublishParams).signing  # the keys' content, not only their paths, decides re-signing
    write_json(KEY_HASHES, key_identities(keys.private_key, keys.public_key))
    read = f" ({cache.reads} file(s) read, {cache.hits} unchanged by stat)" if cache.reads or cache.hits else ""
    say("sources: " + ", ".join(describe_fingerprint(role, fp) for role, fp in prints.items()) + read)
    resource_plan(p, show=not remembered)
    # Group sizes chosen for the target's layer widths (validated above), said before any variant is built; only
    # when the recipe check ran (what it depends on changed): reading the widths imports transformers (seconds).
    if not remembered:
        say_group_sizes(p)


if __name__ == "__main__":
    main()
