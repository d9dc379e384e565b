"""Which stages' outputs two `dvc repro` builds agree on, from their dvc.lock files (issue #32 item 4).

    python benchmarks/cpu/compare_locks.py FIRST_LOCK SECOND_LOCK > OUT.json

Per stage: the outputs whose md5 differ (empty: the stage's outputs are byte-identical in both builds).
tests/project/test_pipeline_e2e.py uses differing_outputs on two builds of the tiny pipeline."""

import json
import sys

import yaml


def outs(lock_text: str) -> dict[str, dict[str, str]]:
    """Per stage in a dvc.lock's text: each output's path and md5 (a directory's is its listing's)."""
    stages = yaml.safe_load(lock_text)["stages"]
    return {name: {o["path"]: o.get("md5") for o in stage.get("outs", [])} for name, stage in stages.items()}


def differing_outputs(first_lock: str, second_lock: str) -> dict[str, list[str]]:
    """Per stage of the second lock, the outputs whose md5 is not the first lock's (a stage or an output the
    first lacks counts as differing); stages whose outputs all agree map to []."""
    first, second = outs(first_lock), outs(second_lock)
    return {name: sorted(p for p in second[name] if first.get(name, {}).get(p) != second[name][p]) for name in second}


def main() -> None:
    with open(sys.argv[1]) as a, open(sys.argv[2]) as b:
        differ = differing_outputs(a.read(), b.read())
    print(
        json.dumps(
            {
                "first": sys.argv[1],
                "second": sys.argv[2],
                "identical": sorted(n for n, d in differ.items() if not d),
                "differ": {n: d for n, d in differ.items() if d},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
