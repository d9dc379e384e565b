"""Stage `data`: validate, dedup and split the domain traffic."""
from pathlib import Path

from pipeline.config import load_params
from pipeline.data import dedup, drop_too_long, load_traffic, split, write_split
from pipeline.io import atomic_dir, write_json
from pipeline.lmeval import write_task_data
from pipeline.loading import load_tokenizer
from pipeline.stage import say, stage_main

OUT = Path("artifacts/data")


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()["data"]
    rows = load_traffic(p["traffic"])
    unique = dedup(rows)
    tokenizer = load_tokenizer("artifacts/models/target")
    kept, too_long = drop_too_long(unique, tokenizer, p["max_tokens"])
    splits = split(kept, p["fractions"], p["seed"])
    with atomic_dir(OUT) as tmp:
        for name, convs in splits.items():
            write_split(convs, tmp / f"{name}.jsonl")
        write_task_data(splits["heldout"], tokenizer, tmp / "heldout_lmeval.jsonl")  # for evals/domain_heldout
    write_json("metrics/data.json", {"rows": len(rows), "duplicates_dropped": len(rows) - len(unique),
                                     "too_long_dropped": too_long, **{k: len(v) for k, v in splits.items()}})
    say(f"data: {len(rows)} rows -> " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))


if __name__ == "__main__":
    main()
