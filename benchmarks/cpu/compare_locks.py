"""Which stages' outputs two `dvc repro` builds agree on, from their dvc.lock files (issue #32 item 4).

    python benchmarks/cpu/compare_locks.py FIRST_LOCK SECOND_LOCK > OUT.json

Per stage: the outputs whose md5 differ (empty: the stage's outputs are byte-identical in both builds)."""
import json
import sys

import yaml


def outs(path: str) -> dict[str, dict[str, str]]:
    stages = yaml.safe_load(open(path))["stages"]
    return {name: {o["path"]: o.get("md5") for o in stage.get("outs", [])} for name, stage in stages.items()}


def main() -> None:
    first, second = outs(sys.argv[1]), outs(sys.argv[2])
    differ = {name: sorted(p for p in second[name] if first.get(name, {}).get(p) != second[name][p]) for name in second}
    print(json.dumps({"first": sys.argv[1], "second": sys.argv[2], "identical": sorted(n for n, d in differ.items() if not d),
                      "differ": {n: d for n, d in differ.items() if d}}, indent=1))


if __name__ == "__main__":
    main()
