"""Stage `sources` (always runs): fingerprints of the target and draft sources, so that `models`
re-runs when a local model directory is edited in place or a Hub revision moves, and only then.
Being first in every `dvc repro`, it is also where the whole params.yaml is checked, recipes included."""
from pipeline.config import enabled_variant, group_sizes, load_params
from pipeline.io import write_json
from pipeline.sources import source_fingerprint
from pipeline.stage import say, stage_main

OUT = "artifacts/sources.json"


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    prints = {"target": source_fingerprint(p["target"]["source"], "target", p["target"].get("revision")),
              "draft": source_fingerprint(p["draft"]["source"], "draft")}
    write_json(OUT, prints)
    say("sources: " + ", ".join(f"{role} {fp['kind']} {(fp.get('sha256') or fp.get('revision') or '')[:12]}".rstrip()
                                for role, fp in prints.items()))
    # Group sizes chosen for the target's layer widths (validated above), said before any variant is built.
    for name, group in group_sizes(p, [enabled_variant(p, v) for v in p["quantize"]["enabled"]]).items():
        if group.reason:
            say(f"sources: quantize {name}: group_size {group.configured} -> {group_label(group.used)} ({group.reason})")


def group_label(size: int) -> str:
    return "channel-wise" if size == -1 else str(size)


if __name__ == "__main__":
    main()
