"""Stage `publish`: re-check each bundle's gate verdict, verify it and push it to the configured registry.

Each bundle carries its own verdict (GATE.json) and numbers (EVAL.json) under its MANIFEST.json; the
current gate run's verdicts say whether it is still the build to ship (pipeline/release/publish.py)."""

from pipeline.core import paths, records
from pipeline.core.errors import PipelineError
from pipeline.core.io import write_json
from pipeline.core.names import registry_name
from pipeline.core.stage import say, stage_main
from pipeline.params.load import load_params, parse_section
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import signing
from pipeline.release.binding import check_binding
from pipeline.release.gates import GateReport
from pipeline.release.publish import pinned_copy, release_tags
from pipeline.release.registry import get_backend
from pipeline.release.settings import GatesParams, PublishParams
from pipeline.serving.settings import ServingParams


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()  # checked as a whole by `sources`, first in every repro
    pub, gates = parse_section(p, PublishParams), parse_section(p, GatesParams)
    name = parse_section(p, ServingParams).name
    backend = get_backend(pub.backend)
    current = records.read(GateReport, paths.VERDICT)
    releases = {}
    for variant in parse_section(p, QuantizeParams).enabled:  # every bundle checked before any is published
        bundle = paths.BUNDLES / variant
        if not bundle.is_dir():
            raise PipelineError(f"no bundle for {variant} at {bundle}; run `dvc repro` (its gates may have failed)")
        version, tags = release_tags(
            bundle, variant, pub.version, list(gates.allow_fail), current, gates.for_variant(variant)
        )
        # built for this name and version (PROVENANCE.json, in the digest the pinned copy is checked against)
        check_binding(bundle, registry_name(name, variant), version, tags["bundle_digest"], required=True)
        releases[variant] = (bundle, version, tags)
    receipts = []
    for variant, (bundle, version, tags) in releases.items():
        with pinned_copy(bundle, tags["bundle_digest"], paths.PUBLISH_STAGING) as copy:
            if pub.signing.public_key:
                signing.verify(copy, pub.signing.public_key)  # the published copy, not the directory it came from
            receipt = backend.publish(copy, registry_name(name, variant), version, tags, pub)
        receipts.append(receipt)
        say(f"publish {variant}: {receipt['status']} {receipt['name']} {receipt['version']} -> {receipt['uri']}")
    write_json(paths.RECEIPT, {"backend": pub.backend, "published": receipts})


if __name__ == "__main__":
    main()
