"""Stage `draft_quantize`: the draft that bundles serve, the fine-tuned one as trained or quantized
with a quantize variant's recipe (draft_quantize.variant)."""

import shutil

from pipeline.core import paths, records
from pipeline.core.io import atomic_dir
from pipeline.core.sizes import dir_size, megabytes
from pipeline.core.stage import say, stage_main
from pipeline.data.traffic import read_split
from pipeline.drafts import methods
from pipeline.drafts.served import ServedDraft
from pipeline.drafts.settings import DraftParams, DraftQuantizeParams
from pipeline.params.load import load_params, parse_section
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import QuantizeParams


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    name = parse_section(p, DraftQuantizeParams).variant
    if methods.DRAFT_MODEL not in parse_section(p, DraftParams).method:
        served = ServedDraft(quantized_variant=None, size_mb=None, skipped=methods.not_requested(methods.DRAFT_MODEL))
        with atomic_dir(paths.DRAFT) as tmp:
            records.write(tmp / paths.DRAFT_RECORD.name, served)
        say(f"draft_quantize: skipped ({served.skipped})")
        return
    with atomic_dir(paths.DRAFT) as tmp:
        if name is None:
            shutil.copytree(paths.DRAFT_FINETUNED, tmp / paths.DRAFT_MODEL.name)
        else:
            from pipeline.drafts.draft_model import quantize_draft  # torch, transformers: only to quantize

            quantize = parse_section(p, QuantizeParams)
            quantize_draft(
                paths.DRAFT_FINETUNED,
                tmp / paths.DRAFT_MODEL.name,
                variant_spec(quantize.variants, name),
                read_split(paths.CALIBRATION),
                quantize.calibration,
            )
        size_mb = megabytes(dir_size(tmp / paths.DRAFT_MODEL.name, ".safetensors"))
        served = ServedDraft(quantized_variant=name, size_mb=size_mb)
        records.write(tmp / paths.DRAFT_RECORD.name, served)
    say(
        # draft_finetune ships the base draft when its fine-tune ended worse (its line says which): name neither here
        f"draft_quantize: serving draft_finetune's draft {'as it is' if name is None else 'quantized as ' + name} "
        f"({served.size_mb} MB)"
    )


if __name__ == "__main__":
    main()
