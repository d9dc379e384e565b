"""The wheels a requirements file needs on the GPU host beyond what it already has (build_load.sh).

pip's resolver cannot do this: asked for the closure of llm-compressor or dvc it resolves torch's CUDA libraries
too, which the host has and no mirror here serves. So the closure is walked by hand: each requirement is
downloaded alone (`pip download --no-deps` for CPython 3.12 on manylinux x86_64), its METADATA read, and the walk
does not enter a package the host's image or the vLLM kit already holds (their names, in PRESENT). A package with
no wheel (pure-Python sdists such as antlr4-python3-runtime) is built into one with `pip wheel`.

    python load_wheels.py PRESENT OUT_DIR [--no-deps] REQUIREMENT_FILE [REQUIREMENT ...]

PRESENT: the names present on the host, one per line, in any spelling (normalized here). --no-deps: the roots'
wheels alone, their requirements not walked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from email.parser import Parser
from pathlib import Path

# pip's own copy: the Python 3.12 that runs this needs nothing installed
from pip._vendor.packaging.requirements import Requirement

PY312 = sys.executable  # run under Python 3.12: `pip wheel` builds for the interpreter that runs it
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"] + [
    a
    for p in (
        "manylinux_2_35",
        "manylinux_2_34",
        "manylinux_2_31",
        "manylinux_2_28",
        "manylinux_2_27",
        "manylinux_2_24",
        "manylinux_2_17",
        "manylinux2014",
        "manylinux1",
    )
    for a in ("--platform", f"{p}_x86_64")
]
HOST = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def fetch(req: Requirement, out: Path) -> Path:
    """One wheel for req in out (downloaded, else built from its sdist); its path."""
    spec = f"{req.name}{req.specifier}"
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [PY312, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", tmp, spec],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            run = subprocess.run(
                [PY312, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, spec], capture_output=True, text=True
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or len(wheels) != 1:
            sys.exit(f"{spec}: no wheel ({run.stderr.strip().splitlines()[-1:] or '?'})")
        target = out / wheels[0].name
        wheels[0].replace(target)
        return target


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = Parser().parsestr(z.read(meta).decode())
    reqs = []
    for line in headers.get_all("Requires-Dist") or []:
        r = Requirement(line)
        if r.marker is None or any(r.marker.evaluate({**HOST, "extra": e}) for e in extras | {""}):
            reqs.append(r)
    return reqs


def main(present_file: str, out_dir: str, *roots: str) -> int:
    walk = roots[:1] != ("--no-deps",)
    roots = roots if walk else roots[1:]
    present = {canon(name) for name in Path(present_file).read_text().split()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    todo: list[Requirement] = []
    for root in roots:
        lines = Path(root).read_text().splitlines() if Path(root).is_file() else [root]
        todo += [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]
    seen: dict[str, Path] = {}
    with ThreadPoolExecutor(4) as pool:
        while todo:
            level = {}
            for r in todo:
                name = canon(r.name)
                if name not in present and name not in seen and name not in level:
                    level[name] = r
            todo = []
            for (name, r), wheel in zip(level.items(), pool.map(lambda r: fetch(r, out), level.values())):
                seen[name] = wheel
                if walk:
                    todo += requires(wheel, set(r.extras))
    for name, wheel in sorted(seen.items()):
        print(wheel.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
