"""Stage `models`: materialize the target and the base draft (demo, local dir, GGUF, Hub, or the target's own
first layers) and check, before any expensive stage, that each tokenizer agrees with its config and chat
template, reads text as a model can (pipeline/models/model_proof.py: round trip, pieces per character, a GGUF's own
vocabulary, <bos>), that prompts are laid out as data.prompt_format says, that the draft can speculate for the
target, and that the target's perplexity on a few rows of its own traffic is not absurd."""

from pipeline.core import paths
from pipeline.core.io import atomic_dir, write_json
from pipeline.core.stage import say, stage_main
from pipeline.data.formatting import prompt_and_response_ids
from pipeline.data.settings import DataParams
from pipeline.data.traffic import first_conversations
from pipeline.models.draft_compat import check_compatible
from pipeline.models.loading import load_tokenizer
from pipeline.models.materialize import ProofTraffic, build_demo, fetch_sources, shown_target, summary_line
from pipeline.models.model_proof import PERPLEXITY_ROWS, check_perplexity, traffic_perplexity
from pipeline.models.settings import DemoParams, DraftSourceParams, TargetParams
from pipeline.models.sources import check_sources
from pipeline.params.load import PARAMS_FILE, load_params, parse_section
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.serving.parallelism import decide_enabled, read_config
from pipeline.serving.settings import ServingParams
from pipeline.serving.sharding import with_calibration_ignore


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    target, draft = parse_section(p, TargetParams), parse_section(p, DraftSourceParams).source
    check_sources(target.source, draft, PARAMS_FILE)  # this stage's own params (also checked by `sources`)
    max_model_len = parse_section(p, ServingParams).max_model_len
    data = parse_section(p, DataParams)
    rows = first_conversations(data.traffic, PERPLEXITY_ROWS)  # the traffic the models are proved on
    traffic = ProofTraffic(data.prompt_format, data.traffic, [m["content"] for messages in rows for m in messages])
    with atomic_dir(paths.TARGET) as target_tmp, atomic_dir(paths.DRAFT_BASE) as draft_tmp:
        if target.source == "demo":
            built = build_demo(target_tmp, draft_tmp, parse_section(p, DemoParams), traffic)
        else:
            built = fetch_sources(target, draft, target_tmp, draft_tmp, traffic)
        check_compatible(target_tmp, draft_tmp, max_model_len)
        tensor_parallel = gpus_per_replica(p, target_tmp)  # a variant that can't fit fails before any is quantized
        say(f"models: {built.format_line}")
        perplexity = own_traffic_perplexity(target_tmp, rows)  # the one check that loads weights: last
        check_perplexity(perplexity, target.max_perplexity, shown_target(target), len(rows), data.traffic)
    write_json("metrics/models.json", built.record(data.prompt_format, len(rows), perplexity))
    say(
        summary_line(
            built,
            target,
            draft,
            perplexity,
            len(rows),
            ", ".join(f"{v} {d.tensor_parallel_size}" for v, d in tensor_parallel.items()),
        )
    )


def own_traffic_perplexity(target_dir, rows: list[list[dict]]) -> float:
    """The target's perplexity on the answers of rows, each laid out as every later stage lays it out."""
    tokenizer = load_tokenizer(target_dir)
    return traffic_perplexity(target_dir, [prompt_and_response_ids(tokenizer, messages) for messages in rows])


def gpus_per_replica(p: dict, target_dir) -> dict:
    """Each enabled variant's tensor parallelism from the built target's config (bytes estimated from its shape and
    the scheme; pipeline/serving/parallelism.py): where the `sources` stage could not read the config (a Hub model
    not yet in the cache), this is the first place it is known. One line for a variant that can't fit."""
    quantize = parse_section(p, QuantizeParams)
    specs = {v: with_calibration_ignore(variant_spec(quantize.variants, v), p) for v in quantize.enabled}
    return decide_enabled(parse_section(p, ServingParams), specs, read_config(target_dir))


if __name__ == "__main__":
    main()
