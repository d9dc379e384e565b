"""Bundles served exactly as shipped, under load, with their capacity at the SLO (issues #28 item 6, #33 item 6).

    python benchmarks/gpu/serve_shipped.py OUT BUNDLE...

For each bundle directory, in order: `modelprep verify` (its manifest's hashes), then `vllm serve --config serve.yaml`
from the bundle directory with its serve.env in the environment (as deploy/<tier>.yaml starts it), `vllm bench serve`
over the held-out traffic (artifacts/data/heldout.jsonl, rendered with the bundle's chat template) at each concurrency
of --concurrency, then the capacity search at params.yaml's serving.slo on the same server
(pipeline/serving/capacity.py, serve_bench.capacity's bounds). A bundle whose serve.yaml speculates is also served
without its speculative-config (serve-plain.yaml, written beside it in a copy of the directory's links), so "its own
plain decoding" is measured in the same run; a bundle that ships plain decoding is its own plain.

OUT/<variant>/raw/<config>-<tag>.json are `vllm bench serve --save-result` files (tag c<N> or capacity-c<N>),
OUT/<variant>/<config>-server.log vLLM's log, OUT/shipped.json one line of facts per bundle and config (served
config's SHA-256, the kernels vLLM's log says it selected, startup seconds, the capacity found). benchmarks/render.py
renders them into CAPACITY.md (benchmarks/tables/capacity.py). GPU + vLLM only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from pipeline.data.formatting import prompt_text  # noqa: E402
from pipeline.data.traffic import heldout_prompts  # noqa: E402
from pipeline.models.loading import load_tokenizer  # noqa: E402
from pipeline.serving import capacity, load_generator  # noqa: E402
from pipeline.serving.settings import ServeBenchParams, ServingParams  # noqa: E402
from pipeline.serving.sweep import kernels_in_log  # noqa: E402
from pipeline.serving.vllm_server import serve  # noqa: E402

SPEC_KEY = "speculative-config"


def serve_env(bundle: Path) -> dict[str, str]:
    path = bundle / "serve.env"
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def verify(bundle: Path) -> None:
    """`modelprep verify BUNDLE` (its manifest's hashes); SystemExit naming the bundle when it fails."""
    check = subprocess.run(
        [sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())", "verify", str(bundle)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        raise SystemExit(f"{bundle}: modelprep verify failed: {check.stderr.strip()[-300:]}")


def configs_of(bundle: Path, work: Path) -> dict[str, Path]:
    """config name -> the serve.yaml to start from `work` (links to the bundle's files): shipped, and plain when
    the shipped one speculates."""
    for entry in bundle.iterdir():
        (work / entry.name).symlink_to(entry.resolve())
    shipped = yaml.safe_load((bundle / "serve.yaml").read_text())
    out = {"shipped": work / "serve.yaml"}
    if SPEC_KEY in shipped:
        plain = {k: v for k, v in shipped.items() if k != SPEC_KEY}
        (work / "serve-plain.yaml").write_text(yaml.safe_dump(plain, sort_keys=False))
        out["plain"] = work / "serve-plain.yaml"
    return out


def measure_bundle(bundle: Path, out: Path, p: dict, concurrency: list[int], facts: list[dict]) -> None:
    cfg, serving = ServeBenchParams.parse(p["serve_bench"]), p["serving"]
    typed = ServingParams.parse(serving)  # serving.slo and its arrival, typed once (settings.py)
    slo, arrival = typed.slo, typed.arrival
    engine = json.loads((bundle / "engine_args.json").read_text())
    name = engine["served_model_name"]
    variant = bundle.name
    where = out / variant
    (where / "raw").mkdir(parents=True, exist_ok=True)
    verify(bundle)
    tokenizer = load_tokenizer(bundle / "model")
    rendered = [prompt_text(tokenizer, m) for m in heldout_prompts(ROOT / "artifacts/data/heldout.jsonl")]
    with tempfile.TemporaryDirectory(prefix="shipped-") as tmp:
        work = Path(tmp)
        dataset = work / "prompts.jsonl"
        load_generator.write_dataset(dataset, [text for text, _ in rendered])
        traffic = load_generator.Traffic(dataset, work / "model", rendered[0][1])
        env = serve_env(bundle)
        for config, path in configs_of(bundle, work).items():
            log = where / f"{config}-server.log"
            bench_log = where / f"{config}-bench.log"
            started = time.time()
            with serve(path, work, log, cfg.startup_timeout_s, cfg.port, env) as server:

                def bench(load: float, prompts: int, tag: str, warmups: int = 0):
                    client = load_generator.Client(name, traffic, cfg, 0.0, slo.goodput())
                    level = load_generator.bench_level(
                        server,
                        client,
                        where / "raw" / f"{config}-{tag}.json",
                        bench_log,
                        load,
                        prompts,
                        warmups,
                        poisson=tag.startswith("capacity-r"),
                    )
                    print(
                        f"RESULT {variant} {config} {tag} {level.output_throughput:.0f} tok/s "
                        f"p99 TTFT {level.ttft_ms['p99']:.1f} ms p99 ITL {level.itl_ms['p99']:.1f} ms",
                        flush=True,
                    )
                    return level

                levels = [
                    bench(c, load_generator.num_prompts(cfg, c), f"c{c}", cfg.warmup_requests) for c in concurrency
                ]
                bounds = cfg.capacity
                found = capacity.search(
                    lambda x: bench(x, capacity.probe_prompts(cfg, arrival, x), f"capacity-c{int(x)}"),
                    slo,
                    arrival,
                    bounds.max_concurrency,
                    bounds.max_probes,
                    known=levels,
                    gpus=serving["tensor_parallel_size"],
                )
                startup_s = server.startup_s
            facts.append(
                {
                    "variant": variant,
                    "config": config,
                    "bundle_serve_yaml_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                    "serve_env": env,
                    "startup_s": round(startup_s, 1),
                    "wall_s": round(time.time() - started, 1),
                    "kernels_used": kernels_in_log(log),
                    "slo": slo.label(),
                    "capacity": {
                        k: v for k, v in dataclasses.asdict(found).items() if k not in ("level", "probes", "slo")
                    },
                }
            )
            print(f"CAPACITY {variant} {config} {found.status} {found.users_per_gpu:g} users/GPU", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    args = ap.parse_args()
    import torch
    import vllm

    p = yaml.safe_load(args.params.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    facts: list[dict] = []
    header = {
        "gpu": torch.cuda.get_device_name(0),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "concurrency": args.concurrency,
        "params": str(args.params.name),
        "command": "python benchmarks/gpu/serve_shipped.py " + " ".join(sys.argv[1:]),
    }
    for bundle in args.bundles:
        try:
            measure_bundle(bundle.resolve(), args.out, p, args.concurrency, facts)
        except Exception as e:  # one bundle vLLM can't serve must not hide the others
            print(f"ERR {bundle.name}: {str(e)[:400]}", flush=True)
            facts.append({"variant": bundle.name, "error": str(e)[:1000]})
        (args.out / "shipped.json").write_text(json.dumps({**header, "results": facts}, indent=2) + "\n")


if __name__ == "__main__":
    main()
