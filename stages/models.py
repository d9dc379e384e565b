"""Stage `models`: materialize the target and the base draft (demo, local dir, GGUF, Hub, or the target's own
first layers) and check, before any expensive stage, that each tokenizer agrees with its config and chat
template, reads text as a model can (pipeline/models/model_proof.py: round trip, pieces per character, a GGUF's own
vocabulary, <bos>), that prompts are laid out as data.prompt_format says, that the draft can speculate for the
target, and that the target's perplexity on a few rows of its own traffic is not absurd."""
from pipeline.core import paths
from pipeline.core.io import atomic_dir, read_json, write_json
from pipeline.core.stage import record_timings, say, stage_main
from pipeline.data.formatting import prompt_and_response_ids
from pipeline.data.settings import DataParams
from pipeline.data.traffic import first_conversations
from pipeline.models.draft_compat import check_compatible
from pipeline.models.loading import load_tokenizer
from pipeline.models.model_proof import (
    PERPLEXITY_ROWS,
    check_perplexity,
    prompt_format_line,
    prove_source,
    prove_tokenizer,
    traffic_perplexity,
)
from pipeline.models.settings import DemoParams, DraftSourceParams, LayerDraft, TargetParams
from pipeline.models.sources import check_sources, fetch_model, source_fingerprint
from pipeline.models.tokenizer_check import check_tokenizer
from pipeline.params.load import PARAMS_FILE, load_params, parse_section
from pipeline.quantize.recipes import variant_spec
from pipeline.quantize.settings import QuantizeParams
from pipeline.serving.parallelism import decide_enabled, read_config
from pipeline.serving.settings import ServingParams


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    target, draft = parse_section(p, TargetParams), parse_section(p, DraftSourceParams).source
    check_sources(target.source, draft, PARAMS_FILE)  # this stage's own params (also checked by `sources`)
    max_model_len = parse_section(p, ServingParams).max_model_len
    data = parse_section(p, DataParams)
    rows = first_conversations(data.traffic, PERPLEXITY_ROWS)  # the traffic the models are proved on
    texts = [m["content"] for conversation in rows for m in conversation]
    cut = draft if isinstance(draft, LayerDraft) else None
    seconds = None  # the demo pair's pretraining; other sources are fetched, not trained
    proofs = {}
    shown_target = "demo target" if target.source == "demo" else target.source
    with atomic_dir(paths.TARGET) as target_tmp, atomic_dir(paths.DRAFT_BASE) as draft_tmp:
        if target.source == "demo":
            from pipeline.models.demo.models import build_demo_pair

            pair, seconds = build_demo_pair(target_tmp, draft_tmp, parse_section(p, DemoParams))
            summary = {"source": "demo", **pair}
            record_timings("models", seconds)
            for role, built in (("target", target_tmp), ("draft", draft_tmp)):
                check_tokenizer(built, role, shown=f"demo {role}")
                proofs[role] = prove_tokenizer(built, role, f"demo {role}", texts)
            format_line = prompt_format_line(load_tokenizer(target_tmp), target_tmp, shown_target, data.prompt_format,
                                             data.traffic)
        else:
            # Hub sources download at the commit the `sources` stage fingerprinted, not wherever a branch is now.
            prints = read_json(paths.SOURCES) if paths.SOURCES.is_file() else {  # run by hand, without `dvc repro`
                "target": source_fingerprint(target.source, "target", target.revision),
                "draft": source_fingerprint(draft, "draft")}
            fetch_model(target.source, target_tmp, "target", prints["target"].get("revision"))
            check_tokenizer(target_tmp, "target", shown=target.source)  # before a draft is downloaded or cut
            proofs["target"] = prove_source(target_tmp, "target", target.source, texts)
            format_line = prompt_format_line(load_tokenizer(target_tmp), target_tmp, target.source, data.prompt_format,
                                             data.traffic)
            if cut is not None:  # the target's own tokenizer files, checked above
                from pipeline.models.layer_draft import build_layer_draft
                from pipeline.models.loading import check_checkpoint_tensors

                prints = {**prints, "draft": build_layer_draft(target_tmp, draft_tmp, cut.layers)}
                check_checkpoint_tensors(draft_tmp, "draft")  # the cut config and weights describe one model
            else:
                fetch_model(draft, draft_tmp, "draft", prints["draft"].get("revision"))
                check_tokenizer(draft_tmp, "draft", shown=draft)
                proofs["draft"] = prove_source(draft_tmp, "draft", draft, texts)
            summary = prints
        check_compatible(target_tmp, draft_tmp, max_model_len)
        tensor_parallel = gpus_per_replica(p, target_tmp)  # a variant that can't fit fails before any is quantized
        say(f"models: {format_line}")
        perplexity = own_traffic_perplexity(target_tmp, rows)  # the one check that loads weights: last
        check_perplexity(perplexity, target.max_perplexity, shown_target, len(rows), data.traffic)
    summary = {**summary, "proof": {**{role: proof.to_json() for role, proof in proofs.items()},
                                    "prompt_format": data.prompt_format, "traffic_rows": len(rows),
                                    "target_perplexity": round(perplexity, 3)}}
    write_json("metrics/models.json", summary)
    drafted = f", draft = its first {cut.layers} layers" if cut is not None else ""
    source = target.source if target.source == "demo" else "their sources"
    pretrained = (f" (pretrained in {seconds['target']['train_s']:.0f} s and {seconds['draft']['train_s']:.0f} s)"
                  if seconds else "")
    say(f"models: target and draft from {source}{pretrained}{drafted}, compatible; target perplexity "
        f"{perplexity:.1f} on {len(rows)} rows of its traffic; GPUs per replica: "
        + ", ".join(f"{v} {d.tensor_parallel_size}" for v, d in tensor_parallel.items()))


def own_traffic_perplexity(target_dir, rows: list[list[dict]]) -> float:
    """The target's perplexity on the answers of rows, each laid out as every later stage lays it out."""
    tokenizer = load_tokenizer(target_dir)
    return traffic_perplexity(target_dir, [prompt_and_response_ids(tokenizer, messages) for messages in rows])


def gpus_per_replica(p: dict, target_dir) -> dict:
    """Each enabled variant's tensor parallelism from the built target's config (bytes estimated from its shape and
    the scheme; pipeline/serving/parallelism.py): where the `sources` stage could not read the config (a Hub model
    not yet in the cache), this is the first place it is known. One line for a variant that can't fit."""
    quantize = parse_section(p, QuantizeParams)
    specs = {v: variant_spec(quantize.variants, v) for v in quantize.enabled}
    return decide_enabled(parse_section(p, ServingParams), specs, read_config(target_dir))


if __name__ == "__main__":
    main()
