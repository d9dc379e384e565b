"""Stage `models`: materialize the target and the base draft (demo, local dir, or Hub) and check,
before any expensive stage, that the draft can speculate for the target."""
from pathlib import Path

from pipeline.config import load_params
from pipeline.draft_compat import check_compatible
from pipeline.errors import PipelineError
from pipeline.io import atomic_dir, read_json, write_json
from pipeline.sources import fetch_model, source_fingerprint
from pipeline.stage import say, stage_main

TARGET, DRAFT = Path("artifacts/models/target"), Path("artifacts/models/draft-base")
SOURCES = Path("artifacts/sources.json")


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    target_src, draft_src = p["target"]["source"], p["draft"]["source"]
    if (target_src == "demo") != (draft_src == "demo"):
        raise PipelineError("target.source and draft.source must both be 'demo' or both be real models")
    with atomic_dir(TARGET) as target_tmp, atomic_dir(DRAFT) as draft_tmp:
        if target_src == "demo":
            from pipeline.demo.models import build_demo_pair

            summary = {"source": "demo", **build_demo_pair(target_tmp, draft_tmp, p["demo"])}
        else:
            # Hub sources download at the commit the `sources` stage fingerprinted, not wherever a branch is now.
            prints = read_json(SOURCES) if SOURCES.is_file() else {  # run by hand, without `dvc repro`
                "target": source_fingerprint(target_src, "target", p["target"].get("revision")),
                "draft": source_fingerprint(draft_src, "draft")}
            fetch_model(target_src, target_tmp, "target", prints["target"].get("revision"))
            fetch_model(draft_src, draft_tmp, "draft", prints["draft"].get("revision"))
            summary = prints
        check_compatible(target_tmp, draft_tmp, p["serving"]["max_model_len"])
    write_json("metrics/models.json", summary)
    say(f"models: target and draft from {target_src if target_src == 'demo' else 'their sources'}, compatible")


if __name__ == "__main__":
    main()
