"""Independent DVC stages at the same time on a host of several GPUs, each group on its own GPUs, then recorded.

`dvc repro` runs one stage at a time: it holds the repository's lock for the whole run (parallel stages are DVC's
open issue iterative/dvc#755). A GPU run's independent stages (the quantized variants, the draft model's chain, the
EAGLE-3 head, each variant's `evaluate`) then leave three of a 4-GPU host's GPUs idle. This runs each group's stages
in order, each exactly its dvc.yaml `cmd` from the repository root with CUDA_VISIBLE_DEVICES set to the group's GPUs,
the groups at the same time; then `dvc commit --force` records every stage that finished, its deps and outs hashed
as `dvc repro` records them (DVC's documented use of `commit`: a stage's command run by hand). A later `dvc repro`
finds them up to date, or runs again one whose deps changed since. A stage whose command fails ends its group (the
stages after it in that group are not run) and is not committed; the exit status is then 1.

Before anything runs: every stage named exists, appears once, and each of its deps exists or is an out of a stage
earlier in its own group (the upstream stages come from a `dvc repro` before this).

    python benchmarks/gpu/stage_groups.py GPUS:STAGE[,STAGE...] ...
    e.g. 0:quantize@fp8-dynamic,quantize@gptq-w4a16 1:distill,draft_finetune 2:eagle3

Each stage's output goes to LOG_DIR/<stage>.log (STAGE_GROUPS_LOGS, default /tmp/stage-groups); this prints DVC's
"Running stage" line when one starts, and its last line (the stage's summary) and its time when it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Group:
    gpus: str  # CUDA_VISIBLE_DEVICES for its stages
    stages: tuple[str, ...]


def parse(args: list[str]) -> list[Group]:
    groups = []
    for arg in args:
        gpus, sep, names = arg.partition(":")
        if not sep or not gpus or not names:
            raise SystemExit(f"stage_groups: {arg!r}: expected GPUS:STAGE[,STAGE...] (e.g. 0,1:distill,eagle3)")
        groups.append(Group(gpus, tuple(n for n in names.split(",") if n)))
    if not groups:
        raise SystemExit("stage_groups: no groups given")
    named = [s for g in groups for s in g.stages]
    repeated = sorted({s for s in named if named.count(s) > 1})
    if repeated:
        raise SystemExit(f"stage_groups: stage {repeated[0]!r} named twice")
    return groups


def overlaps(a: str, b: str) -> bool:
    """One path is the other or lies under it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def check(groups: list[Group], stages: dict) -> None:
    """Every stage exists; each dep is on disk or an out of an earlier stage in its own group, and none is (or
    holds, or lies in) an out of a stage named elsewhere: every named stage's outs are removed before anything runs
    and rewritten while the groups run, so such a dep would be read half-made."""
    for name in (n for g in groups for n in g.stages):
        if name not in stages:
            raise SystemExit(f"stage_groups: no stage {name!r} in dvc.yaml (dvc stage list names them)")
    for group in groups:
        for position, name in enumerate(group.stages):
            earlier = set(group.stages[:position])
            for dep in stages[name].deps:  # fs_path: absolute (a stage's paths are relative to its own wdir)
                maker = next(
                    (
                        other
                        for g in groups
                        for other in g.stages
                        if any(overlaps(dep.fs_path, o.fs_path) for o in stages[other].outs)
                    ),
                    None,
                )
                if maker is not None and maker not in earlier:
                    raise SystemExit(f"stage_groups: {name}: dep {dep} is written by {maker}, not earlier in its group")
                if maker is None and not Path(dep.fs_path).exists():
                    raise SystemExit(f"stage_groups: {name}: dep {dep} does not exist (run its stage first)")


RUNNING: list[subprocess.Popen] = []  # every stage command now running, each in its own session (stopped on Ctrl-C)
STOPPING = threading.Event()


def run_group(group: Group, stages: dict, logs: Path, finished: list[str], lock: threading.Lock) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": group.gpus}
    for name in group.stages:
        if STOPPING.is_set():
            return
        stage = stages[name]
        log = logs / f"{name.replace('/', '_').replace(':', '_')}.log"
        with lock:
            print(f"Running stage '{name}' on GPUs {group.gpus}:\n> {stage.cmd}", flush=True)
        start = time.monotonic()
        with open(log, "w") as out, lock:
            proc = subprocess.Popen(
                stage.cmd,
                shell=True,
                cwd=stage.wdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: an interrupt stops the stage and its children
            )
            RUNNING.append(proc)
        rc = proc.wait()
        seconds = time.monotonic() - start
        lines = log.read_text(errors="replace").splitlines()
        last = next((line for line in reversed(lines) if line.strip()), "")
        with lock:
            if rc == 0:
                finished.append(name)
            verdict = "finished" if rc == 0 else f"FAILED (exit status {rc}; {log})"
            print(f"Stage '{name}' {verdict} in {seconds:.0f} s on GPUs {group.gpus}: {last[-300:]}", flush=True)
        if rc != 0:
            return


def main(argv: list[str]) -> int:
    from dvc.repo import Repo  # DVC's own view of dvc.yaml: the same cmd, deps and outs `dvc repro` uses

    groups = parse(argv)
    repo = Repo(".")
    stages = {s.addressing: s for s in repo.index.stages}
    check(groups, stages)
    with repo.lock:  # outs removed before anything runs, as `dvc repro` does before each stage
        for name in (s for g in groups for s in g.stages):
            stages[name].remove_outs(ignore_remove=False, force=True)
    logs = Path(os.environ.get("STAGE_GROUPS_LOGS", "/tmp/stage-groups"))
    logs.mkdir(parents=True, exist_ok=True)
    finished: list[str] = []  # the stages whose command exited 0
    lock = threading.Lock()
    threads = [threading.Thread(target=run_group, args=(g, stages, logs, finished, lock)) for g in groups]

    # SIGTERM (a timeout, a closed session) as Ctrl-C, and SIGINT even where it was inherited ignored
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:  # stop every stage (nothing is committed)
        STOPPING.set()
        with lock:
            for proc in RUNNING:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for t in threads:
            t.join()
        print("stage_groups: interrupted; the stages that were running were stopped, nothing committed")
        return 130
    committed = []
    for name in finished:
        try:
            repo.commit(name, force=True)
            committed.append(name)
        except Exception as e:  # e.g. a command that exited 0 without writing an out
            print(f"stage_groups: {name} finished but could not be committed: {e}", flush=True)
    total = sum(len(g.stages) for g in groups)
    print(f"stage_groups: {len(committed)} of {total} stages finished and committed")
    return 0 if len(committed) == total else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
