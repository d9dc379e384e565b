"""Whether a serve_bench config measured beside others on its own GPUs gives the tokens/s it gives alone (issue 50
item 3): two serve records of one variant on one host, one with `serve_bench.parallel: "off"` and one with `auto`.

    python benchmarks/gpu/parallel_check.py ALONE.json BESIDE.json [--tolerance 0.05]

Per config (plain decoding on each kernel, each method, the k schedule) and concurrency of the sweep: output tokens/s
beside over alone, the GPUs and neighbours the beside run recorded. Exit status 1 when any ratio is outside
1 +- tolerance (then keep serve_bench.parallel off for such hosts), 2 when the records can't be compared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.core import records  # noqa: E402
from pipeline.serving.bench_record import ServeBenchRecord, ServeConfigResult  # noqa: E402


def configs(record: ServeBenchRecord) -> dict[str, ServeConfigResult]:
    """Every config of the default sweep by its label: each kernel's plain, each method, each k schedule."""
    out = {f"plain-{kernel}": c for kernel, c in record.kernels.items()}
    out |= record.configs
    out |= {f"{method}-schedule": c for method, c in record.schedules.items()}
    return out


def rows(alone: ServeBenchRecord, beside: ServeBenchRecord) -> list[dict]:
    """A row per config and concurrency measured in both: tokens/s alone and beside, their ratio, where it ran."""
    if (alone.gpu, alone.vllm_version) != (beside.gpu, beside.vllm_version):
        raise SystemExit(
            f"not comparable: {alone.gpu} vLLM {alone.vllm_version} against {beside.gpu} vLLM {beside.vllm_version}"
        )
    a, b = configs(alone), configs(beside)
    out = []
    for name in [n for n in a if n in b]:
        for key, level in a[name].levels.items():
            other = b[name].levels.get(key)
            if other is None or level.failed or other.failed or not level.output_throughput:
                continue
            out.append(
                {
                    "config": name,
                    "concurrency": level.concurrency,
                    "alone": level.output_throughput,
                    "beside": other.output_throughput,
                    "ratio": other.output_throughput / level.output_throughput,
                    "gpus": ",".join(b[name].gpus or []),
                    "next_to": ", ".join(b[name].beside) or "(alone)",
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("alone", type=Path)
    ap.add_argument("beside", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args(argv)
    try:
        table = rows(records.read(ServeBenchRecord, args.alone), records.read(ServeBenchRecord, args.beside))
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    if not table:
        print("no config measured in both records", file=sys.stderr)
        return 2
    print("| config | concurrency | tok/s alone | tok/s beside | beside/alone | GPUs | beside |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        print(
            f"| {r['config']} | {r['concurrency']} | {r['alone']:.0f} | {r['beside']:.0f} | {r['ratio']:.3f} | "
            f"{r['gpus']} | {r['next_to']} |"
        )
    worst = max(table, key=lambda r: abs(r["ratio"] - 1))
    ok = abs(worst["ratio"] - 1) <= args.tolerance
    print(
        f"\nlargest difference: {worst['config']} at c={worst['concurrency']}, x{worst['ratio']:.3f} "
        f"({'within' if ok else 'outside'} {args.tolerance:.0%})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
