"""Stage `data`: validate, dedup and split the domain traffic."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir, write_json
from pipeline.core.stage import say, stage_main
from pipeline.data.settings import DataParams
from pipeline.data.traffic import (
    conversation_key,
    dedup,
    drop_too_long,
    max_token_bytes,
    read_grouped,
    read_source,
    split,
    write_split,
)
from pipeline.evaluate.lmeval import write_task_data
from pipeline.models.loading import load_tokenizer
from pipeline.params.load import load_params, parse_section


@stage_main()
def main(argv: list[str]) -> None:
    data = parse_section(load_params(), DataParams)
    tokenizer = load_tokenizer(paths.TARGET)
    rows, groups, oversized = read_grouped(data.traffic, data.max_tokens * max_token_bytes(tokenizer))
    unique = dedup(rows)
    kept, too_long = drop_too_long(unique, tokenizer, data.max_tokens)
    too_long += oversized
    splits = split(kept, data.fractions, data.seed, groups)
    with atomic_dir(paths.DATA) as tmp:
        for name, convs in splits.items():
            write_split(convs, tmp / f"{name}.jsonl")
        write_task_data(splits["heldout"], tokenizer, tmp / "heldout_lmeval.jsonl")  # for evals/domain_heldout
    total = len(rows) + oversized
    duplicates = len(rows) - len(unique)
    record = {
        "rows": total,
        "duplicates_dropped": duplicates,
        "too_long_dropped": too_long,
        **{k: len(v) for k, v in splits.items()},
    }
    if groups:  # grouped traffic: how many documents (groups) each split holds; ungrouped files' metrics as before
        record["groups"] = {k: len({groups.get(conversation_key(m)) for m in v}) for k, v in splits.items()}
    if source := read_source(data.traffic):
        record["source"] = source
    write_json("metrics/data.json", record)
    say(summary_line(total, duplicates, too_long, data.max_tokens, {k: len(v) for k, v in splits.items()}))


def summary_line(total: int, duplicates: int, too_long: int, max_tokens: int, splits: dict[str, int]) -> str:
    """'data: 500 rows read, 37 dropped (37 longer than data.max_tokens 1024 tokens) -> 463 kept: ...': whether
    rows were dropped, how many and why, before the split sizes."""
    reasons = [
        f"{n} {why}"
        for n, why in (
            (duplicates, "duplicates of an earlier conversation"),
            (too_long, f"longer than data.max_tokens {max_tokens} tokens"),
        )
        if n
    ]
    dropped = f"{duplicates + too_long} dropped ({', '.join(reasons)})" if reasons else "none dropped"
    return f"data: {total} rows read, {dropped} -> {sum(splits.values())} kept: " + ", ".join(
        f"{k} {n}" for k, n in splits.items()
    )


if __name__ == "__main__":
    main()
