"""Stage `sources` (always runs): fingerprints of the target and draft sources, so that `models`
re-runs when a local model directory is edited in place or a Hub revision moves, and only then.
Being first in every `dvc repro`, it is also where the whole params.yaml is checked, recipes included, and
where a GGUF source (`smollm2`, a .gguf file) is converted on first use (cached: pipeline/gguf_source.py)."""
from pipeline.config import load_params
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
    say("sources: " + ", ".join(describe(role, fp) for role, fp in prints.items()))


def describe(role: str, fp: dict) -> str:
    if fp["kind"] == "target":
        return f"{role} the target's first {fp['layers']} layers"
    return f"{role} {fp['kind']} {(fp.get('sha256') or fp.get('revision') or '')[:12]}".rstrip()


if __name__ == "__main__":
    main()
