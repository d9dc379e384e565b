"""Stage `bundle@<variant>`: assemble the serving-ready directory for one gated variant, shipping what the gate
decided (pipeline/release/decision.py; pipeline/release/assembly.py reads, checks and assembles)."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir
from pipeline.core.stage import say, stage_main
from pipeline.drafts.settings import DraftParams
from pipeline.params.load import load_params, parse_section, variant_argument
from pipeline.quantize.settings import QuantizeParams
from pipeline.release import assembly
from pipeline.release.settings import DeployParams, MonitoringParams, PublishParams
from pipeline.serving.settings import ServingParams


@stage_main()
def main(argv: list[str]) -> None:
    variant = variant_argument(argv, "bundle")
    p = load_params()
    sections = assembly.Sections(
        *(
            parse_section(p, kind)
            for kind in (QuantizeParams, ServingParams, DraftParams, DeployParams, MonitoringParams, PublishParams)
        )
    )
    inputs = assembly.read_inputs(variant, p, sections)
    with atomic_dir(paths.BUNDLES / variant) as tmp:
        manifest = assembly.assemble(tmp, inputs)
    say(assembly.summary_line(inputs, manifest))


if __name__ == "__main__":
    main()
