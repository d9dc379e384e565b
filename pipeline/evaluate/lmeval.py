"""lm-eval harness runs: the project's own tasks in evals/ plus standard tasks available locally."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.data.formatting import prompt_ids, split_prompt_response

EVALS_DIR = Path(__file__).resolve().parents[2] / "evals"
# Local data files and the HF datasets cache only: a standard task whose data is not there fails
# at once instead of waiting on a hub. Set before `datasets` is imported, which reads it then.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def write_task_data(conversations: list[list[dict]], tokenizer, path: Path) -> None:
    """{prompt, response} rows with the prompt rendered exactly as the server renders it."""
    lines = []
    for messages in conversations:
        prompt_messages, response = split_prompt_response(messages)
        prompt = tokenizer.decode(prompt_ids(tokenizer, prompt_messages))
        lines.append(json.dumps({"prompt": prompt, "response": response + (tokenizer.eos_token or "")}))
    path.write_text("\n".join(lines) + "\n")


def backend(tensor_parallel_size: int = 1) -> str:
    """`vllm` when a GPU and vLLM are present, else `hf` (transformers on CPU). A GPU host with fewer GPUs than
    the model is served on is an error: scoring a model sized for tensor parallelism on CPU instead would take
    hours and measure something other than what is served."""
    import torch

    from pipeline.evaluate.vllm_spec import too_few_gpus, unavailable_reason

    if unavailable_reason() is not None:
        return "hf"
    too_few = too_few_gpus(tensor_parallel_size, torch.cuda.device_count())
    if too_few:
        raise PipelineError(f"evaluate.lm_eval runs through vLLM sharded as served, but {too_few}")
    return "vllm"


def vllm_model_args(model_dir: str | Path, vllm_args: dict | None = None) -> dict:
    """lm-eval's vllm model_args: vllm_args (gpu_memory_utilization, max_model_len, tensor_parallel_size, ...)
    over the defaults; tensor_parallel_size 1 unless given."""
    return {
        "pretrained": str(model_dir),
        "gpu_memory_utilization": 0.3,
        "enforce_eager": True,
        "tensor_parallel_size": 1,
        **(vllm_args or {}),
    }


@functools.lru_cache(maxsize=2)
def task_manager(include_defaults: bool = True):
    """lm-eval's task index plus evals/ (evals/ alone without include_defaults); building lm-eval's scans thousands of
    YAMLs, so once per process."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(EVALS_DIR), include_defaults=include_defaults)


def manager_for(tasks: list[str]):
    """The index of evals/ alone when it defines every task (the demo's domain_heldout), else lm-eval's too: indexing
    lm-eval's thousands of task YAMLs took ~7-11 s of each evaluate stage, for tasks it did not run. The tasks are
    built from the same YAMLs either way."""
    own = task_manager(include_defaults=False)
    if tasks and all(isinstance(t, str) and t in own.all_tasks for t in tasks):
        return own
    return task_manager()


def check_tasks(manager, tasks: list[str]) -> None:
    """Build each task (which loads its data) so that an unknown task, or one whose data is not
    available locally, is one line naming it rather than a traceback from inside lm-eval."""
    if not tasks:
        raise PipelineError("evaluate.lm_eval.tasks is empty; list domain_heldout and/or standard lm-eval tasks")
    for task in tasks:
        if not isinstance(task, str):
            raise PipelineError(f"evaluate.lm_eval.tasks entries are task names, got {task!r}")
        if task not in manager.all_tasks:
            raise PipelineError(f"lm-eval task {task!r} is not defined in evals/ nor known to lm-eval")
        try:
            manager.load([task])
        except Exception as e:  # noqa: BLE001 - any failure to build a task is a data/config problem
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise PipelineError(
                f"lm-eval task {task!r}: its data is not available locally ({reason}); "
                "put it in the HF datasets cache or remove the task from evaluate.lm_eval.tasks"
            ) from None


def run_tasks(
    model_dir: str | Path,
    tasks: list[str],
    limit: int | None,
    batch_size: int = 8,
    vllm_args: dict | None = None,
    loaded=None,
    name: str | None = None,
) -> dict:
    """Scores per task, e.g. {"domain_heldout": {"byte_perplexity": 1.3, "acc": 0.4}}. vllm_args
    (gpu_memory_utilization, max_model_len, tensor_parallel_size, ...) apply only to the vllm backend, which
    runs only where the host has tensor_parallel_size GPUs. loaded: model_dir's model as load_causal_lm(model_dir,
    cpu) loads it, already in memory (the evaluate stage's), for the hf backend instead of a second load. name: the
    model type (hf | vllm) as evaluate.backend resolved it (pipeline/evaluate/backend.py); None: backend()'s."""
    import lm_eval
    import torch

    manager = manager_for(tasks)
    check_tasks(manager, tasks)
    name = name or backend((vllm_args or {}).get("tensor_parallel_size", 1))
    if name == "vllm":
        from pipeline.core.multigpu import multicast_off
        from pipeline.evaluate.vllm_spec import spawn_engine_if_cuda_initialized

        spawn_engine_if_cuda_initialized()
        model_args = vllm_model_args(model_dir, vllm_args)
        multicast_off(model_args["tensor_parallel_size"])
    else:
        # The model as the evaluate stage scores it (pipeline/models/loading.py: decompressed into float32 on CPU;
        # lm-eval's own from_pretrained would leave an NVFP4 checkpoint's weights in bfloat16).
        from pipeline.models.loading import load_causal_lm, load_tokenizer

        usable = loaded is not None and loaded.device.type == "cpu"
        model_args = {
            "pretrained": loaded if usable else load_causal_lm(model_dir, torch.device("cpu")),
            "tokenizer": load_tokenizer(model_dir),
        }
    out = lm_eval.simple_evaluate(
        model=name,
        model_args=model_args,
        tasks=tasks,
        limit=limit,
        batch_size=batch_size,
        device="cuda" if name == "vllm" else "cpu",
        task_manager=manager,
        log_samples=False,
        bootstrap_iters=0,
    )
    return {"backend": name, **scores_of(out)}


def scores_of(out: dict) -> dict:
    """{"scores": {task: {metric: value}}, "samples": {task: n}} from simple_evaluate's output. A score is one of the
    task's metrics (its `higher_is_better` entries, e.g. acc, byte_perplexity); lm-eval's bookkeeping numbers beside
    them in "results" (sample_len, the documents scored) are not quality metrics and never become one: they go to
    "samples", outside what the gates and the card read as scores."""
    scores, samples = {}, {}
    for task, result in out["results"].items():
        metrics = set((out.get("higher_is_better") or {}).get(task) or {})
        values = {
            k.split(",")[0]: v
            for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "stderr" not in k
        }
        if "sample_len" in values:
            samples[task] = values.pop("sample_len")
        scores[task] = {k: v for k, v in values.items() if not metrics or k in metrics}
    return {"scores": scores, "samples": samples}
