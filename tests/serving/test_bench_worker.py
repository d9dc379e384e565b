"""The kept `vllm bench serve` worker (pipeline/serving/bench_worker.py) with vLLM's real client.

Live only: set VLLM_BENCH_PYTHON to a Python with vLLM's client (benchmarks/README.md says how on a CPU machine);
CI has none, so it skips and says so. The server is benchmarks/cpu/openai_cpu_server.py (transformers on CPU, a tiny
random-weight model); what is under test is the worker and the parent's handling of it, not any speed."""

from __future__ import annotations

import json
import os
import sys

import pytest

from pipeline.core.errors import PipelineError
from pipeline.serving import load_generator
from pipeline.serving.vllm_server import VLLM_MODULE, serve
from tiny_project import ROOT

PYTHON = os.environ.get("VLLM_BENCH_PYTHON")
pytestmark = pytest.mark.skipif(
    not PYTHON, reason="VLLM_BENCH_PYTHON is not set: vLLM's client is not installed here (CI never has it)"
)


def test_levels_run_in_one_worker_and_a_failed_level_leaves_it_serving(tmp_path):
    from tiny_chatml import chatml_tokenizer, save_checkpoint, tiny_llama

    tokenizer = chatml_tokenizer()
    model = save_checkpoint(tmp_path / "model", tiny_llama(tokenizer, layers=1, tied=True), tokenizer)
    dataset = tmp_path / "prompts.jsonl"
    load_generator.write_dataset(
        dataset,
        [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in ("hello world", "the quick brown fox")
        ],
    )
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps({"model": str(model), "served-model-name": "tiny", "fail-every": 0}))
    client = [PYTHON, "-m", VLLM_MODULE]
    log = tmp_path / "bench.log"
    with serve(
        config,
        tmp_path,
        tmp_path / "server.log",
        300,
        None,
        command=[sys.executable, str(ROOT / "benchmarks/cpu/openai_cpu_server.py")],
    ) as server:

        def level(c: int, name: str, **kw):
            result = tmp_path / f"{name}.json"
            command = load_generator.bench_command(
                client,
                server.base_url,
                load_generator.LoadSpec("tiny", model, dataset, c, 4, 4, 0.0, False, result, **kw),
            )
            return load_generator.run_level(command, server.base_url, result, log)

        first = level(1, "c1")
        [worker] = load_generator._idle[PYTHON]  # given back once its level ended
        assert first.completed == 4 and first.failed == 0
        # an argument vLLM's own parser refuses: one error line naming the log, and the same worker serves on
        with pytest.raises(PipelineError, match=r"`vllm bench serve` failed \(exit 2\).*\(log: .*bench\.log\)"):
            load_generator.run_level(
                [*client, "bench", "serve", "--no-such-flag"], server.base_url, tmp_path / "none.json", log
            )
        second = level(2, "c2", warmups=1)
        assert load_generator._idle[PYTHON] == [worker] and worker.alive()
        assert second.concurrency == 2 and second.completed == 4
    load_generator.close_workers()
    assert not worker.alive()
