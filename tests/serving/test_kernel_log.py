"""Issue 46 item 3: the kernels vLLM chose for a mixed checkpoint, read from the served log, named per scheme in the
card's layout. The log lines are vLLM 0.26's, copied byte for byte from committed raw logs."""

from __future__ import annotations

from pathlib import Path

from bundle_helpers import render_card
from pipeline.core import records
from pipeline.evaluate.vllm_spec import VllmMeasurement
from pipeline.quantize.settings import UNQUANTIZED
from pipeline.serving.bench_record import PLAIN, LoadLevel, ServeBenchRecord, ServeConfigResult
from pipeline.serving.kernel_log import (
    WNA16,
    kernel_schemes_in_log,
    kernels_in_log,
    layout_kernels,
    vllm_scheme_of,
)

# benchmarks/gpu/raw/smollm2-gpu-4/logs/serve_bench@gptq-w4a16.ngram-server.log, lines 24-27: one engine whose
# CompressedTensorsWNA16 layers took two kernels (Marlin where Machete does not take SmolLM2's widths), with the
# attention backend's "Using ..." lines between them.
WNA16_LINES = (
    "(EngineCore pid=6442) INFO 11-25 22:55:42 [compressed_tensors_wNa16.py:137] Using MarlinLinearKernel for "
    "CompressedTensorsWNA16\n"
    "(EngineCore pid=6442) INFO 11-25 22:55:42 [cuda.py:482] Using FLASH_ATTN attention backend out of potential "
    "backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].\n"
    "(EngineCore pid=6442) INFO 11-25 22:55:42 [flash_attn.py:776] Using FlashAttention version 3\n"
    "(EngineCore pid=6442) INFO 11-25 22:55:42 [compressed_tensors_wNa16.py:137] Using MacheteLinearKernel for "
    "CompressedTensorsWNA16\n"
)
# benchmarks/gpu/raw/gpu-schemes-served/logs/serve_bench@fp8-block.plain-server.log, line 21 (the "Selected" form)
FP8_LINE = (
    "(EngineCore pid=5419) INFO 11-24 20:27:28 [__init__.py:600] Selected CutlassFp8BlockScaledMMKernel for "
    "CompressedTensorsW8A8Fp8\n"
)
LAYOUT = {"W4A16": [1, 2], "W8A16": [3, 4, 5], UNQUANTIZED: [0, 6]}


def test_every_kernel_is_read_with_the_vllm_scheme_it_serves(tmp_path: Path):
    log = tmp_path / "server.log"
    log.write_text(WNA16_LINES + FP8_LINE + WNA16_LINES)  # a second engine start repeats its lines
    assert kernels_in_log(log) == ["MarlinLinearKernel", "MacheteLinearKernel", "CutlassFp8BlockScaledMMKernel"]
    assert kernel_schemes_in_log(log) == {
        WNA16: ["MarlinLinearKernel", "MacheteLinearKernel"],
        "CompressedTensorsW8A8Fp8": ["CutlassFp8BlockScaledMMKernel"],
    }
    assert kernel_schemes_in_log(tmp_path / "missing.log") == {}


def test_each_scheme_of_a_layout_gets_its_vllm_class_and_kernels():
    assert [vllm_scheme_of(s) for s in ("W4A16", "W8A16", UNQUANTIZED, "FP8_DYNAMIC")] == [WNA16, WNA16, None, None]
    rows = layout_kernels({**LAYOUT, "W4A16": [], "W8A16": [1]}, {WNA16: ["MacheteLinearKernel"]})
    assert [(r.scheme, r.layers, r.served()) for r in rows] == [
        ("W8A16", (1,), f"{WNA16} on MacheteLinearKernel"),
        (UNQUANTIZED, (0, 6), "unquantized, no quantized kernel"),
    ]
    assert layout_kernels(LAYOUT, {})[0].served() == f"{WNA16}, no kernel named in vLLM's log"
    assert [r.served() for r in layout_kernels(LAYOUT, None)] == [None, None, None]  # not served


def served_record(tmp_path: Path, log_text: str) -> ServeBenchRecord:
    """A serve_bench record whose plain config read its kernels from this server log, written and read back as the
    bundle stage reads metrics/serve-<v>.json."""
    log = tmp_path / "plain-server.log"
    log.write_text(log_text)
    level = LoadLevel(
        concurrency=1,
        num_prompts=4,
        completed=4,
        failed=0,
        duration_s=2.0,
        request_throughput=2.0,
        output_throughput=100.0,
        ttft_ms={"p50": 10.0, "p99": 12.0},
        tpot_ms={"p50": 9.0, "p99": 10.0},
        itl_ms={"p50": 9.0, "p99": 10.0},
        e2el_ms={"p50": 500.0, "p99": 520.0},
    )
    record = ServeBenchRecord(
        "mixed-w4a16",
        gpu="NVIDIA H100 80GB HBM3",
        vllm_version="0.26.0",
        date="2026-11-27",
        load_generator="vllm bench serve",
        max_tokens=64,
        temperature=0.0,
        configs={
            PLAIN: ServeConfigResult(
                0, 90.0, {"c1": level}, kernels_used=kernels_in_log(log), kernel_schemes=kernel_schemes_in_log(log)
            )
        },
    )
    records.write(tmp_path / "serve-mixed-w4a16.json", record)
    return records.read(ServeBenchRecord, tmp_path / "serve-mixed-w4a16.json")


def test_the_card_names_the_kernels_vllm_chose_for_each_scheme_of_the_layout(tmp_path: Path):
    mixed = {"layout": LAYOUT, "passed": True, "frontier_point": 3, "frontier_points": 13, "reason": []}
    quant = {"size_before_mb": 269.1, "size_after_mb": 145.0, "compression_ratio": 1.86, "mixed": mixed}
    card = render_card(
        "mixed-w4a16", VllmMeasurement(skipped="no CUDA device"), served_record(tmp_path, WNA16_LINES), quant
    )
    kernels = f"{WNA16} on MarlinLinearKernel, MacheteLinearKernel"
    assert (
        f"`W4A16` layers 1, 2 ({kernels}); `W8A16` layers 3, 4, 5 ({kernels}); `UNQUANTIZED` layers 0, 6 "
        "(unquantized, no quantized kernel). One checkpoint, one config group per quantized scheme; the kernels "
        "are those vLLM's log named when serve_bench served it on NVIDIA H100 80GB HBM3"
    ) in card

    not_served = render_card(
        "mixed-w4a16",
        VllmMeasurement(skipped="no CUDA device"),
        ServeBenchRecord("mixed-w4a16", skipped="no CUDA device"),
        quant,
    )
    assert "`W4A16` layers 1, 2; `W8A16` layers 3, 4, 5; `UNQUANTIZED` layers 0, 6. The cheapest" in not_served
