"""Quantize a target with llm-compressor's oneshot and save it in compressed-tensors format."""
from __future__ import annotations

import resource
import time
from pathlib import Path

import torch

from pipeline.errors import PipelineError
from pipeline.recipes import build_recipe, needs_calibration, validate_spec, weight_group_size
from pipeline.sizes import dir_size


def compute_setup() -> tuple[str, torch.dtype]:
    """bf16 on GPU; float32 on CPU, where bf16 matmuls are slow (AWQ on a 21M model took 629 s)."""
    return ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)


def guard_awq_on_cpu() -> None:
    """llm-compressor 0.14's AWQ pins cached activations (IntermediatesCache.pin_memory) to speed
    host->device copies; pinning needs an accelerator and raises on a CPU-only host. With no
    device to copy to, pinning buys nothing, so make it a no-op there (only there)."""
    if torch.cuda.is_available():
        return
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None


def check_group_size(model: torch.nn.Module, group_size: int | None, ignore: list[str]) -> None:
    """INT4 group quantization needs every quantized layer's input width divisible by the group."""
    if not group_size:
        return
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not any(name.endswith(i) for i in ignore):
            if module.in_features % group_size:
                raise PipelineError(f"group_size {group_size} does not divide the input width {module.in_features} "
                                    f"of layer {name}; pick a divisor of the layer widths")


def check_traceable(model: torch.nn.Module, sequential_targets: list[str] | None) -> None:
    """Calibrated recipes run llm-compressor's sequential pipeline, which splits the model at its
    decoder-layer class; an architecture that declares none can't be traced without help."""
    if not sequential_targets and not getattr(model, "_no_split_modules", None):
        raise PipelineError(f"architecture {type(model).__name__} declares no decoder-layer class that "
                            "llm-compressor can trace; set quantize.sequential_targets to its layer class name")


def peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def quantize_model(model_dir: Path, out_dir: Path, name: str, spec: dict, calibration_texts: list[str],
                   cfg: dict) -> dict:
    """Run the variant's recipe and save a compressed checkpoint into out_dir (which must be new/temp).

    cfg: num_samples, max_seq_length, ignore, pipeline, sequential_targets, offload (see params.yaml).
    """
    from llmcompressor import oneshot
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    validate_spec(name, spec)
    device, dtype = compute_setup()
    ignore = sorted(set(cfg.get("ignore", [])) | set(spec.get("ignore", [])))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    saved_dtype = AutoConfig.from_pretrained(model_dir).dtype
    # offload: let accelerate place what doesn't fit on the GPU in CPU RAM; the sequential
    # pipeline then onloads one decoder layer at a time, so models larger than the GPU quantize.
    device_map = "auto" if (device == "cuda" and cfg.get("offload")) else None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device_map)
    if device == "cuda" and device_map is None:
        model.to(device)
    check_group_size(model, weight_group_size(spec), ignore)
    calibrate = needs_calibration(spec)
    if calibrate:
        check_traceable(model, cfg.get("sequential_targets"))
    if spec["algorithm"] == "awq":
        guard_awq_on_cpu()

    kwargs = {}
    if calibrate:
        from datasets import Dataset

        if not calibration_texts:
            raise PipelineError(f"variant {name!r} needs calibration data but the calibration split is empty")
        texts = calibration_texts[: cfg["num_samples"]]
        kwargs = dict(dataset=Dataset.from_dict({"text": texts}), num_calibration_samples=len(texts),
                      max_seq_length=cfg["max_seq_length"], shuffle_calibration_samples=False)
        if cfg.get("pipeline"):
            kwargs["pipeline"] = cfg["pipeline"]
        if cfg.get("sequential_targets"):
            kwargs["sequential_targets"] = cfg["sequential_targets"]
    size_before = dir_size(model_dir, suffix=".safetensors")
    t0 = time.perf_counter()
    oneshot(model=model, tokenizer=tokenizer, recipe=build_recipe(name, spec, ignore), **kwargs)
    wall = time.perf_counter() - t0
    # Calibration ran in float32 on CPU; store the unquantized tensors (embeddings, norms,
    # scales) in the checkpoint's own dtype, as a GPU run would.
    if isinstance(saved_dtype, torch.dtype) and saved_dtype != dtype:
        model.to(saved_dtype)
    model.save_pretrained(out_dir, save_compressed=True)
    tokenizer.save_pretrained(out_dir)
    size_after = dir_size(out_dir, suffix=".safetensors")
    return {
        "variant": name,
        "algorithm": spec["algorithm"],
        "scheme": spec["scheme"],
        "device": device,
        "calibration_samples": len(kwargs.get("dataset", [])),
        "wall_time_s": round(wall, 2),
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "size_before_mb": round(size_before / 2**20, 3),
        "size_after_mb": round(size_after / 2**20, 3),
        "compression_ratio": round(size_before / size_after, 3),
    }
