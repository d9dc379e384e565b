"""The run spec: one `run.json` in each raw run folder saying how its files were made.

    {"run": "demo-serve", "date": "2026-11-25", "commit": "0bb4490",
     "commands": ["bash benchmarks/gpu/session.sh demo-serve OUT gptq-w4a16"],
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "count": 1, "driver": "580.159.04", "memory_mib": 81559},
     "software": {"vllm": "0.26.0", "torch": "2.11.0+cu130", "python": "3.12.3"},
     "profile": "profiles/gpu-demo-serve.yaml",
     "sources": {"gpu": "gpu.txt", "software.vllm": "record.json", ...}}

`sources` names, per field, the file its value was read from (or how it was known), so a spec written after the
fact (benchmarks/gpu/backfill_run_specs.py) says which values are recorded and which are not; a value nobody
recorded is null, never guessed. benchmarks/render.py reads specs for the provenance table of each report.

On the GPU host, a run writes its own spec beside its outputs (benchmarks/gpu/session.sh does, for each step):

    python benchmarks/run_spec.py write OUT_DIR --command "bash benchmarks/gpu/session.sh ..." [--profile P]

which reads the GPU from nvidia-smi, the versions from the installed packages (importlib.metadata: nothing is
imported), the commit from RUN_COMMIT or `git rev-parse`, and the date (UTC) from the clock.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

NAME = "run.json"
PACKAGES = ("vllm", "torch", "transformers", "llmcompressor", "compressed-tensors", "lm-eval", "dvc")


@dataclass(frozen=True)
class Gpu:
    name: str | None = None
    count: int | None = None
    driver: str | None = None
    memory_mib: int | None = None

    def describe(self) -> str:
        if self.name is None:
            return "-"
        n = f"{self.count} x " if self.count and self.count > 1 else ""
        return f"{n}{self.name} ({self.driver or 'driver not recorded'})"

    @classmethod
    def parse_smi(cls, text: str) -> "Gpu":
        """nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader (one line per GPU)."""
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if not lines:
            raise ValueError("no GPU line")
        parts = [p.strip() for p in lines[0].split(",")]
        memory = int(parts[2].split()[0]) if len(parts) > 2 else None
        return cls(name=parts[0], count=len(lines), driver=parts[1] if len(parts) > 1 else None, memory_mib=memory)


@dataclass(frozen=True)
class RunSpec:
    run: str
    commands: tuple[str, ...]
    date: str | None = None
    commit: str | None = None
    gpu: Gpu = field(default_factory=Gpu)
    software: dict[str, str] = field(default_factory=dict)
    profile: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["commands"] = list(self.commands)
        return json.dumps(d, indent=2) + "\n"


def load(folder: Path) -> RunSpec:
    path = folder / NAME
    if not path.is_file():
        raise SystemExit(f"{path}: no run spec (python benchmarks/run_spec.py write {folder} --command ...)")
    d = json.loads(path.read_text())
    unknown = set(d) - {f for f in RunSpec.__dataclass_fields__}
    if unknown or not d.get("commands") or not d.get("run"):
        raise SystemExit(
            f"{path}: a run spec needs 'run' and 'commands' and no other keys than "
            f"{sorted(RunSpec.__dataclass_fields__)} (unknown: {sorted(unknown)})"
        )
    return RunSpec(
        run=d["run"],
        commands=tuple(d["commands"]),
        date=d.get("date"),
        commit=d.get("commit"),
        gpu=Gpu(**d.get("gpu") or {}),
        software=dict(d.get("software") or {}),
        profile=d.get("profile"),
        sources=dict(d.get("sources") or {}),
    )


def installed() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def current_commit() -> str | None:
    if os.environ.get("RUN_COMMIT"):
        return os.environ["RUN_COMMIT"]
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.CalledProcessError):
        return None


def write(folder: Path, commands: list[str], profile: str | None, run: str | None = None) -> RunSpec:
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        gpu = Gpu.parse_smi(smi.stdout) if smi.returncode == 0 and smi.stdout.strip() else Gpu()
    except OSError:  # no NVIDIA driver here: the spec says so rather than failing the run
        gpu = Gpu()
    commit = current_commit()
    spec = RunSpec(
        run=run or folder.name,
        commands=tuple(commands),
        date=dt.datetime.now(dt.timezone.utc).date().isoformat(),
        commit=commit,
        gpu=gpu,
        software=installed(),
        profile=profile,
        sources={
            "gpu": "nvidia-smi" if gpu.name else "no nvidia-smi",
            "software": "importlib.metadata on the run's PYTHONPATH",
            "commit": "RUN_COMMIT" if os.environ.get("RUN_COMMIT") else "git rev-parse (this checkout)",
            "date": "clock (UTC)",
        },
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / NAME).write_text(spec.to_json())
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write or show a raw run folder's run.json")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="on the GPU host: a spec for the run writing into DIR")
    w.add_argument("dir", type=Path)
    w.add_argument("--command", action="append", required=True, help="the command line that ran (repeatable)")
    w.add_argument("--profile", help="the params profile(s) the run applied, e.g. profiles/gpu.yaml")
    w.add_argument("--run", help="the run's name (default: DIR's name); its raw folder is named after it")
    s = sub.add_parser("show", help="print a folder's spec")
    s.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "write":
        print(write(args.dir, args.command, args.profile, args.run).to_json(), end="")
    else:
        print(load(args.dir).to_json(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
