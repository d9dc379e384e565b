"""lm-eval harness runs: the project's own tasks in evals/ plus standard tasks available locally."""
from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.formatting import prompt_ids, split_prompt_response

EVALS_DIR = Path(__file__).resolve().parents[1] / "evals"


def write_task_data(conversations: list[list[dict]], tokenizer, path: Path) -> None:
    """{prompt, response} rows with the prompt rendered exactly as the server renders it."""
    lines = []
    for messages in conversations:
        prompt_messages, response = split_prompt_response(messages)
        prompt = tokenizer.decode(prompt_ids(tokenizer, prompt_messages))
        lines.append(json.dumps({"prompt": prompt, "response": response + (tokenizer.eos_token or "")}))
    path.write_text("\n".join(lines) + "\n")


def backend() -> str:
    """`vllm` when a GPU and vLLM are present, else `hf` (transformers on CPU)."""
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


def run_tasks(model_dir: str | Path, tasks: list[str], limit: int | None, batch_size: int = 8) -> dict:
    """Scores per task, e.g. {"domain_heldout": {"perplexity": 1.9, "acc": 0.4}}."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local data files only; never reach for a hub
    import lm_eval
    from lm_eval.tasks import TaskManager

    name = backend()
    if name == "vllm":
        model_args = {"pretrained": str(model_dir), "gpu_memory_utilization": 0.3, "enforce_eager": True}
    else:
        model_args = {"pretrained": str(model_dir), "dtype": "float32", "trust_remote_code": False}
    out = lm_eval.simple_evaluate(model=name, model_args=model_args, tasks=tasks, limit=limit,
                                  batch_size=batch_size, device="cuda" if name == "vllm" else "cpu",
                                  task_manager=TaskManager(include_path=str(EVALS_DIR)), log_samples=False,
                                  bootstrap_iters=0)
    scores = {}
    for task, result in out["results"].items():
        scores[task] = {k.split(",")[0]: v for k, v in result.items()
                        if isinstance(v, (int, float)) and "stderr" not in k}
    return {"backend": name, "scores": scores}
