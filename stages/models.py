"""Stage `models`: materialize the target and the base draft (demo, local dir, or Hub)."""
from pathlib import Path

from pipeline.config import load_params, one_line_errors
from pipeline.errors import PipelineError
from pipeline.io import atomic_dir, write_json
from pipeline.sources import classify, fetch_model

TARGET, DRAFT = Path("artifacts/models/target"), Path("artifacts/models/draft-base")


@one_line_errors
def main() -> None:
    p = load_params()
    target_src, draft_src = p["target"]["source"], p["draft"]["source"]
    with atomic_dir(TARGET) as target_tmp, atomic_dir(DRAFT) as draft_tmp:
        if (target_src == "demo") != (draft_src == "demo"):
            raise PipelineError("target.source and draft.source must both be 'demo' or both be real models")
        if target_src == "demo":
            from pipeline.demo.models import build_demo_pair

            summary = {"source": "demo", **build_demo_pair(target_tmp, draft_tmp, p["demo"])}
        else:
            summary = {"target": {"source": target_src, "kind": fetch_model(target_src, target_tmp, "target",
                                                                              p["target"].get("revision"))},
                       "draft": {"source": draft_src, "kind": fetch_model(draft_src, draft_tmp, "draft")}}
    write_json("metrics/models.json", summary)


if __name__ == "__main__":
    main()
