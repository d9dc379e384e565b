"""`vllm bench serve` kept running: vLLM's load generator imported once, then one benchmark per request.

A fresh `vllm bench serve` process spends most of its life importing vLLM (torch, transformers, the CLI's
subcommands) before its first request: on the H100 host a sweep level of one to three seconds of load took about
25 s from start to result. serve_bench runs a dozen levels and capacity probes per served config, so the stage
keeps one of these workers per Python and sends it each level's argv instead (pipeline/serving/load_generator.py,
BenchWorker).

Run by file path with the Python that has vLLM (`python bench_worker.py`): it imports only the standard library
and vLLM, never this project, so a Python with vLLM but without the pipeline's dependencies can run it.

Protocol, one JSON object per line: the parent writes {"argv": [...], "log": "path"}, where argv is what follows
`vllm bench serve`; the worker points its stdout and stderr at that log (file descriptors 1 and 2, so vLLM's
own logging lands there too), runs the benchmark exactly as the CLI would (vLLM's own parser and main), and
answers {"rc": 0} or {"rc": 1, "error": "..."} on the pipe it was started with. A line "ready" comes first, once
vLLM is imported.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _point_output_at(log: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main() -> int:
    # Answers go to a copy of the original stdout (the parent's pipe), and nothing else does: until the first
    # request re-points fds 1 and 2 at its log, whatever vLLM prints while importing goes to stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # As `vllm bench ...` does before it parses (vllm/entrypoints/cli/main.py): spawn for any worker processes, and
    # the CPU platform where none is detected, which the benchmark's imports need on a host without an accelerator.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    answers.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        _point_output_at(request["log"])
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        try:
            bench_main(parser.parse_args(request["argv"]))
            answer = {"rc": 0}
        except SystemExit as e:  # argparse's errors and any sys.exit inside the benchmark
            answer = {"rc": e.code if isinstance(e.code, int) and e.code else 1, "error": f"exit {e.code}"}
        except Exception as e:  # noqa: BLE001 - the traceback goes to the level's log, the parent raises
            traceback.print_exc()
            answer = {"rc": 1, "error": f"{type(e).__name__}: {e}"[:300]}
        sys.stdout.flush()
        sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
