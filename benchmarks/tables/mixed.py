"""raw/mixed8b/ (benchmarks/gpu/mixed_serve.py): a Llama-3-8B-shape model (random weights) as uniform RTN W4A16,
as one mixed W4A16 + W8A16 + BF16 checkpoint (config groups), and as BF16, each served by `vllm serve` on one GPU.
Rows for SERVING.md's blocks (benchmarks/tables/serving.py)."""

from __future__ import annotations

import json
import re

from tables import read

RUN = read.RAW / "mixed8b"
VARIANTS = ("mixed-w4a16", "rtn-w4a16", "bf16")
BASE, UNIFORM, MIXED = "bf16", "rtn-w4a16", "mixed-w4a16"
CONCURRENCY = (1, 32)
TRAFFIC = re.compile(r"random_input_len=(\d+), random_output_len=(\d+)")


def summary() -> dict:
    return json.loads((RUN / "out" / "summary.json").read_text())


def build() -> dict:
    return json.loads((RUN / "out" / "build.json").read_text())


def layout(variant: str) -> str:
    """Decoder layers per scheme: the mixed layout from build.json, the uniform ones from their names."""
    if variant == MIXED:
        return ", ".join(
            f"{scheme.replace('UNQUANTIZED', 'BF16')} {len(layers)}" for scheme, layers in build()["layout"].items()
        )
    layers = sum(len(v) for v in build()["layout"].values())
    return f"{'W4A16' if variant == UNIFORM else 'BF16'} {layers}"


def rows() -> list[dict]:
    s = summary()
    out = []
    for v in VARIANTS:
        tok = s["output_tokens_per_s"][v]
        kernels = "; ".join(f"{k}: {', '.join(ks)}" for k, ks in s["kernel_schemes"][v].items())
        out.append(
            {
                "variant": v,
                "layout": layout(v),
                "bytes": s["checkpoint_bytes"][v],
                **{f"c{c}": tok[f"c{c}"] for c in CONCURRENCY},
                **{f"x{c}": tok[f"c{c}"] / s["output_tokens_per_s"][BASE][f"c{c}"] for c in CONCURRENCY},
                **{f"u{c}": tok[f"c{c}"] / s["output_tokens_per_s"][UNIFORM][f"c{c}"] for c in CONCURRENCY},
                "kernel": kernels or "unquantized (no quantized-linear kernel line)",
            }
        )
    return out


def size_facts() -> list[tuple[str, str]]:
    b = summary()["checkpoint_bytes"]
    int4_saving, mixed_saving = b[BASE] - b[UNIFORM], b[BASE] - b[MIXED]
    return [
        ("BF16 - INT4 (uniform W4A16)", f"{int4_saving / 1e9:.2f} GB"),
        ("BF16 - mixed", f"{mixed_saving / 1e9:.2f} GB"),
        ("share of INT4's saving the mixed layout keeps", f"{100 * mixed_saving / int4_saving:.1f}%"),
    ]


def conditions() -> list[tuple[str, str]]:
    spec, gpu_txt = json.loads((RUN / "run.json").read_text()), (RUN / "gpu.txt").read_text()
    served = json.loads((RUN / "out" / "versions-serve.json").read_text())
    cmd = json.loads((RUN / "out" / MIXED / "record.json").read_text())["command"]
    flags = {
        cmd[i]: cmd[i + 1]
        for i in range(len(cmd) - 1)
        if cmd[i] in ("--max-model-len", "--max-num-seqs", "--gpu-memory-utilization")
    }
    n_in, n_out = TRAFFIC.search((RUN / "out" / BASE / "c1.log").read_text()).groups()
    visible = re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", gpu_txt)[1]
    return [
        ("GPU", f"one {spec['gpu']['name']} (GPU {visible} of {spec['gpu']['count']}), driver {spec['gpu']['driver']}"),
        (
            "vLLM",
            f"{served['vllm']} (compressed-tensors {served['compressed-tensors']}); checkpoints built with "
            f"compressed-tensors {build()['versions']['compressed-tensors']}",
        ),
        (
            "quantization",
            "round-to-nearest (no calibration), group 128; the mixed layout in one checkpoint "
            "as compressed-tensors config groups",
        ),
        ("server", ", ".join(f"{k.lstrip('-')} {v}" for k, v in flags.items())),
        ("traffic", f"`vllm bench serve` random prompts of {n_in} tokens, {n_out} output tokens each"),
    ]


def greedy() -> list[dict]:
    return [{"pair": pair, **v} for pair, v in summary()["greedy_agreement"].items()]
