"""Stage `draft`: check compatibility, distill the target's answers, fine-tune the draft."""
from pathlib import Path

from pipeline.config import load_params, one_line_errors
from pipeline.data import read_split
from pipeline.draft import build_draft
from pipeline.draft_training import loss_curve_rows
from pipeline.io import write_csv, write_json

TARGET, BASE = Path("artifacts/models/target"), Path("artifacts/models/draft-base")
DATA = Path("artifacts/data")
# Outside DVC's outputs, so checkpoints survive an interrupted `dvc repro` for `resume`.
CHECKPOINTS = Path("artifacts/.cache/draft")


@one_line_errors
def main() -> None:
    p = load_params()
    calibration = read_split(DATA / "calibration.jsonl") if p["draft_training"]["quantize"] else []
    metrics, history = build_draft(TARGET, BASE, Path("artifacts/draft"), read_split(DATA / "draft_train.jsonl"),
                                   read_split(DATA / "heldout.jsonl"), p, CHECKPOINTS, calibration)
    write_csv("plots/draft_loss.csv", loss_curve_rows(history))
    write_json("metrics/draft.json", metrics)
    print(f"draft: acceptance {metrics['acceptance_rate_untrained']:.3f} (untrained) -> "
          f"{metrics['acceptance_rate_finetuned']:.3f} (fine-tuned)")


if __name__ == "__main__":
    main()
