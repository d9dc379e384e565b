"""An in-toto attestation of the whole chain, beside the OpenSSF model-signing signature (issue #47).

`model.sig` proves who signed the bundle's files; nothing said what they were made from. With
`publish.signing.private_key` the bundle stage also writes `attestation.intoto.json`: a DSSE envelope
(payloadType application/vnd.in-toto+json) holding an in-toto Statement v1 whose subject is the bundle
(its registry name and MANIFEST.json's bundle_digest) and whose predicate is SLSA provenance v1 naming the code
commit, the recipe and release binding, the base model's digest, the calibration and draft-training data's digests,
and the evaluation (EVAL.json) and gate (GATE.json) results with their digests. It is signed with the same EC key
(securesystemslib's DSSE signer over the envelope's PAE). `modelprep verify --attestation` checks the signature,
that the subject is this bundle and that the eval and gate results it names are the bundle's own files, then prints
the chain.

Like model.sig, the attestation is outside MANIFEST.json (it names the digest, so the digest can't cover it) and
outside model.sig (each is verified on its own, with the same key).
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.core import paths
from pipeline.core.errors import PipelineError
from pipeline.release.manifest import ATTESTATION, MANIFEST, verify

# dir_input's memory of file hashes by stat, as `sources` keeps one (stages/sources.py): gitignored, this workspace's
HASHES = paths.CACHE / "attestation-hashes.json"

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:modelprep:buildtype:bundle:v1"
BUILDER_ID = "urn:modelprep:stage:bundle"
MAX_ENVELOPE = 1 << 20  # bytes: a statement is a few KB; never read a huge or endless file whole
EVAL, GATE, PROVENANCE = "EVAL.json", "GATE.json", "PROVENANCE.json"


@dataclass(frozen=True)
class Input:
    """One resolved dependency of the build: a role (base-model, calibration-data, ...), its sha256, and where
    it came from (a path in the workspace, the source fingerprint)."""

    name: str
    sha256: str
    uri: str
    annotations: dict | None = None

    def descriptor(self) -> dict:
        out = {"name": self.name, "uri": self.uri, "digest": {"sha256": self.sha256}}
        return {**out, "annotations": self.annotations} if self.annotations else out


def file_input(name: str, path: Path) -> Input:
    from pipeline.release.manifest import sha256_file

    if not path.is_file():
        raise PipelineError(f"attestation: {name} {path} is missing; run `dvc repro` so the bundle's inputs exist")
    return Input(name, sha256_file(path), path.as_posix())


def dir_input(name: str, path: Path, annotations: dict | None = None, hashes: Path | None = HASHES) -> Input:
    """A directory's digest the way MANIFEST.json digests a bundle (every file's name and sha256), every file
    included (a model directory's own MANIFEST.json or model.sig too: file_table would leave those out). Each file's
    sha256 is remembered by stat in hashes (None: no memory): every bundle@<variant> attests the same base model, so
    only the first reads its gigabytes. A memory that can't be read or written costs reading again, never a hash."""
    from pipeline.models.sources import HashCache
    from pipeline.release.manifest import _regular_files, digest

    if not path.is_dir():
        raise PipelineError(f"attestation: {name} {path} is missing; run `dvc repro` so the bundle's inputs exist")
    cache = HashCache(hashes)
    files = {rel: {"sha256": cache.sha256(path / rel)} for rel, _ in _regular_files(path)}
    cache.save()
    return Input(name, digest(files), path.as_posix(), annotations)


def statement(bundle: Path, provenance: dict, inputs: list[Input]) -> dict:
    """The in-toto Statement for a finished bundle (its MANIFEST.json written): provenance is PROVENANCE.json's
    record (code commit, recipe, release binding, libraries)."""
    manifest = verify(bundle)
    release = provenance.get("release") or {}
    code = _code_dependency(provenance)
    byproducts = _byproducts(bundle, manifest)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": release.get("name") or bundle.name, "digest": {"sha256": manifest["bundle_digest"]}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "variant": provenance.get("variant"),
                    "recipe": provenance.get("recipe"),
                    "release": release,
                },
                "internalParameters": {"libraries": provenance.get("libraries", {})},
                "resolvedDependencies": code + [i.descriptor() for i in inputs],
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID},
                "metadata": {"finishedOn": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                # the results the release decision rests on, and the bundle files that hold them
                "byproducts": byproducts,
            },
        },
    }


def _code_dependency(provenance: dict) -> list[dict]:
    """The code commit as a resolved dependency, where the provenance has one."""
    return (
        [
            {
                "name": "code",
                "uri": "git+file:.",
                "digest": {"gitCommit": provenance["git_commit"]},
                "annotations": {"dirty": provenance.get("git_dirty")},
            }
        ]
        if provenance.get("git_commit")
        else []
    )


def _byproducts(bundle: Path, manifest: dict) -> list[dict]:
    """The evaluation and gate records, their digests and the values the release decision rests on."""
    eval_record = json.loads((bundle / EVAL).read_bytes())
    gate_record = json.loads((bundle / GATE).read_bytes())
    files = manifest["files"]
    return [
        {
            "name": "evaluation",
            "uri": EVAL,
            "digest": {"sha256": files[EVAL]["sha256"]},
            "annotations": {k: v for k, v in eval_record.items() if not isinstance(v, (dict, list))},
        },
        {
            "name": "gate",
            "uri": GATE,
            "digest": {"sha256": files[GATE]["sha256"]},
            "annotations": {
                "passed": gate_record.get("passed"),
                "allowed_failure": gate_record.get("allowed_failure"),
                "checks": [
                    {k: c.get(k) for k in ("check", "value", "threshold", "failed")}
                    for c in gate_record.get("checks", [])
                ],
            },
        },
    ]


def _private_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    from pipeline.release.signing import _password, check_key_type

    check_key_type(path, "private_key")  # EC only, one line otherwise
    return serialization.load_pem_private_key(path.read_bytes(), _password())


def _public_key(path: Path):
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.signer import SSlibKey

    from pipeline.release.signing import check_key_type

    check_key_type(path, "public_key")
    return SSlibKey.from_crypto(serialization.load_pem_public_key(path.read_bytes()))


def attest(bundle: Path, private_key: str | Path, inputs: list[Input]) -> dict:
    """Write the signed attestation into the finished bundle; the statement it holds."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    from pipeline.core.io import atomic_write_text
    from pipeline.release.binding import PROVENANCE as PROV

    record = json.loads((bundle / PROV).read_bytes())
    body = statement(bundle, record, inputs)
    _check_statement(body)
    envelope = Envelope(json.dumps(body, sort_keys=True).encode(), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(_private_key(Path(private_key))))
    atomic_write_text(bundle / ATTESTATION, json.dumps(envelope.to_dict(), indent=1) + "\n")
    return body


def _check_statement(body: dict) -> None:
    """The in-toto reference implementation's own check of a Statement v1 (subject digests, predicate type)."""
    from google.protobuf import json_format
    from in_toto_attestation.v1.statement import Statement
    from in_toto_attestation.v1.statement_pb2 import Statement as StatementPb

    try:
        Statement.copy_from_pb(json_format.ParseDict(body, StatementPb())).validate()
    except (ValueError, json_format.ParseError) as e:
        raise PipelineError(f"attestation: not a valid in-toto Statement v1 ({str(e).splitlines()[0][:160]})") from None


def _read_envelope(bundle: Path) -> dict:
    path = bundle / ATTESTATION
    if not os.path.lexists(path):
        raise PipelineError(
            f"{bundle} has no {ATTESTATION} (built without publish.signing.private_key, or before "
            "bundles were attested); rebuild it with a signing key"
        )
    if not stat.S_ISREG(path.lstat().st_mode):
        raise PipelineError(f"{path} is not a regular file")
    with path.open("rb") as f:
        data = f.read(MAX_ENVELOPE + 1)
    if len(data) > MAX_ENVELOPE:
        raise PipelineError(f"{path} is over {MAX_ENVELOPE} bytes; not an attestation")
    try:
        envelope = json.loads(data)
    except (ValueError, RecursionError):
        raise PipelineError(f"{path} is not valid JSON") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("signatures"), list):
        raise PipelineError(f"{path} is not a DSSE envelope (payload, payloadType, signatures)")
    return envelope


def check(bundle: Path, public_key: str | Path) -> dict:
    """The verified statement: signed by public_key, about this bundle (subject digest = its recomputed digest,
    subject name = the name it was built for), its eval and gate results the bundle's own files. One line
    naming the first problem otherwise."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    bundle = Path(bundle)
    path = bundle / ATTESTATION
    raw = _read_envelope(bundle)
    try:
        envelope = Envelope.from_dict(raw)
        envelope.verify([_public_key(Path(public_key))], 1)
    except VerificationError:
        raise PipelineError(f"{path}: its signature does not verify with {public_key}") from None
    except (KeyError, TypeError, ValueError, base64.binascii.Error) as e:
        raise PipelineError(f"{path} is not a DSSE envelope ({type(e).__name__})") from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise PipelineError(f"{path}: payloadType {envelope.payload_type!r}, expected {PAYLOAD_TYPE}")
    try:
        body = json.loads(envelope.payload)
    except (ValueError, RecursionError):
        raise PipelineError(f"{path}: its payload is not JSON") from None
    if not isinstance(body, dict) or body.get("_type") != STATEMENT_TYPE or body.get("predicateType") != PREDICATE_TYPE:
        raise PipelineError(f"{path}: not an in-toto Statement v1 with a SLSA provenance v1 predicate")
    _check_statement(body)
    _check_subject(bundle, body, path)
    return body


def _check_subject(bundle: Path, body: dict, path: Path) -> None:
    from pipeline.release.binding import read_binding

    manifest = verify(bundle)
    subject = body["subject"][0]
    if subject.get("digest", {}).get("sha256") != manifest["bundle_digest"]:
        raise PipelineError(
            f"{path} attests bundle {str(subject.get('digest', {}).get('sha256'))[:12]}, but "
            f"{bundle}'s {MANIFEST} digest is {manifest['bundle_digest'][:12]}"
        )
    binding = read_binding(bundle)
    if binding is not None and subject.get("name") != binding.name:
        raise PipelineError(f"{path} attests {subject.get('name')}, but the bundle was built for {binding.name}")
    for product in body["predicate"].get("runDetails", {}).get("byproducts", []):
        uri = product.get("uri")
        entry = manifest["files"].get(uri) if isinstance(uri, str) else None
        if entry is None or entry["sha256"] != product.get("digest", {}).get("sha256"):
            raise PipelineError(f"{path}: the {product.get('name')} result it attests is not the bundle's {uri}")


def chain(body: dict) -> list[str]:
    """The attested chain, one line per link: what `modelprep verify --attestation` prints."""
    predicate = body["predicate"]
    build, run = predicate["buildDefinition"], predicate["runDetails"]
    subject = body["subject"][0]
    external = build.get("externalParameters", {})
    lines = [f"bundle     {subject['name']} sha256:{subject['digest']['sha256']}"]
    for dep in build.get("resolvedDependencies", []):
        digest = dep.get("digest", {})
        shown = (
            f"git {digest['gitCommit'][:12]}" + (" (dirty)" if dep.get("annotations", {}).get("dirty") else "")
            if "gitCommit" in digest
            else f"sha256:{digest.get('sha256')}"
        )
        lines.append(
            f"{dep.get('name', '?'):<10} {shown}"
            + (f"  {dep['uri']}" if dep.get("uri") and "gitCommit" not in digest else "")
        )
    recipe = external.get("recipe") or {}
    lines.append(f"recipe     {external.get('variant')}: " + json.dumps(recipe, sort_keys=True)[:200])
    release = external.get("release") or {}
    if release:
        lines.append(f"release    {release.get('name')} version {release.get('version')}")
    for product in run.get("byproducts", []):
        notes = product.get("annotations", {})
        if product.get("name") == "gate":
            failed = [c["check"] for c in notes.get("checks", []) if c.get("failed")]
            verdict = (
                "passed"
                if notes.get("passed")
                else "FAILED (allowed, flagged)"
                if notes.get("allowed_failure")
                else "FAILED"
            )
            extra = f", failed: {', '.join(failed)}" if failed else ""
            lines.append(
                f"gate       {verdict} ({len(notes.get('checks', []))} checks{extra}) "
                f"sha256:{product['digest']['sha256'][:12]}"
            )
        else:
            shown = ", ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(notes.items())[:6]
            )
            lines.append(f"{product.get('name', '?'):<10} {shown} sha256:{product['digest']['sha256'][:12]}")
    return lines
