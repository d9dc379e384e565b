"""Stage `evaluate_draft`: what fine-tuning bought, as speculative acceptance on held-out prompts
against the unquantized target: the base draft, the fine-tuned one, and the served one (quantized
when draft_quantize.variant is set)."""

from pipeline.core import paths, records
from pipeline.core.io import write_json
from pipeline.core.stage import say, stage_main
from pipeline.data.formatting import prompt_ids, split_prompt_response
from pipeline.data.traffic import read_split
from pipeline.drafts.served import ServedDraft
from pipeline.evaluate import acceptance
from pipeline.evaluate.settings import EvaluateParams
from pipeline.models.loading import load_causal_lm, load_tokenizer
from pipeline.params.load import load_params, parse_section

DRAFTS = {"untrained": paths.DRAFT_BASE, "finetuned": paths.DRAFT_FINETUNED, "served": paths.DRAFT_MODEL}


def draft_metrics(label: str, est: acceptance.SpeculativeEstimate) -> dict:
    """One draft's numbers in metrics/draft.json. No cost profile predicts a draft against the unquantized target
    here, so its speedup is the weight-bytes bound at the k that maximises it, and named so (it read as a prediction
    under `expected_speedup_<label>`, issue #49)."""
    return {
        f"token_acceptance_{label}": est.token_acceptance,
        f"accepted_per_draft_token_{label}": est.accepted_per_draft_token,  # at ideal_k
        f"weight_bytes_k_{label}": est.ideal_k,
        f"weight_bytes_speedup_{label}": est.ideal_speedup,
    }


@stage_main()
def main(argv: list[str]) -> None:
    cfg = parse_section(load_params(), EvaluateParams).acceptance
    served = records.read(ServedDraft, paths.DRAFT_RECORD)
    if served.skipped:
        write_json("metrics/draft.json", {"skipped": served.skipped})
        say(f"evaluate_draft: skipped ({served.skipped})")
        return
    tokenizer, target = load_tokenizer(paths.TARGET), load_causal_lm(paths.TARGET)
    prompts = [prompt_ids(tokenizer, split_prompt_response(m)[0]) for m in read_split(paths.HELDOUT)[: cfg.prompts]]
    drafts = {k: v for k, v in DRAFTS.items() if k != "served" or served.quantized_variant}  # else served == finetuned
    metrics = {"served_draft_quantized_variant": served.quantized_variant}
    for label, draft_dir in drafts.items():
        est = acceptance.estimate(
            target,
            load_causal_lm(draft_dir),
            prompts,
            cfg.continuation_tokens,
            cfg.temperature,
            cfg.max_k,
            acceptance.resolve_cost_ratio(cfg.cost_ratio, paths.TARGET, draft_dir),
        )
        metrics |= draft_metrics(label, est)
    write_json("metrics/draft.json", metrics)
    say(
        f"evaluate_draft: token acceptance {metrics['token_acceptance_untrained']:.3f} (untrained) -> "
        f"{metrics['token_acceptance_finetuned']:.3f} (fine-tuned)"
        + (f" -> {metrics['token_acceptance_served']:.3f} ({served.quantized_variant})" if "served" in drafts else "")
    )


if __name__ == "__main__":
    main()
