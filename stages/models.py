"""Stage `models`: materialize the target and the base draft (demo, local dir, GGUF, Hub, or the target's own
first layers) and check, before any expensive stage, that each tokenizer agrees with its config and chat
template and that the draft can speculate for the target."""
from pipeline.core import paths
from pipeline.core.io import atomic_dir, read_json, write_json
from pipeline.core.stage import record_timings, say, stage_main
from pipeline.models.draft_compat import check_compatible
from pipeline.models.sources import check_sources, fetch_model, source_fingerprint
from pipeline.models.tokenizer_check import check_tokenizer
from pipeline.params.load import PARAMS_FILE, layer_draft, load_params


@stage_main()
def main(argv: list[str]) -> None:
    p = load_params()
    check_sources(p, PARAMS_FILE)  # this stage's own params (also checked by `sources`, with the rest)
    target_src, draft_src = p["target"]["source"], p["draft"]["source"]
    cut = layer_draft(p)
    seconds = None  # the demo pair's pretraining; other sources are fetched, not trained
    with atomic_dir(paths.TARGET) as target_tmp, atomic_dir(paths.DRAFT_BASE) as draft_tmp:
        if target_src == "demo":
            from pipeline.models.demo.models import build_demo_pair

            pair, seconds = build_demo_pair(target_tmp, draft_tmp, p["demo"])
            summary = {"source": "demo", **pair}
            record_timings("models", seconds)
            for role, built in (("target", target_tmp), ("draft", draft_tmp)):
                check_tokenizer(built, role, shown=f"demo {role}")
        else:
            # Hub sources download at the commit the `sources` stage fingerprinted, not wherever a branch is now.
            prints = read_json(paths.SOURCES) if paths.SOURCES.is_file() else {  # run by hand, without `dvc repro`
                "target": source_fingerprint(target_src, "target", p["target"].get("revision")),
                "draft": source_fingerprint(draft_src, "draft")}
            fetch_model(target_src, target_tmp, "target", prints["target"].get("revision"))
            check_tokenizer(target_tmp, "target", shown=target_src)  # before a draft is downloaded or cut
            if cut is not None:  # the target's own tokenizer files, checked above
                from pipeline.models.layer_draft import build_layer_draft
                from pipeline.models.loading import check_checkpoint_tensors

                prints = {**prints, "draft": build_layer_draft(target_tmp, draft_tmp, cut.layers)}
                check_checkpoint_tensors(draft_tmp, "draft")  # the cut config and weights describe one model
            else:
                fetch_model(draft_src, draft_tmp, "draft", prints["draft"].get("revision"))
                check_tokenizer(draft_tmp, "draft", shown=draft_src)
            summary = prints
        check_compatible(target_tmp, draft_tmp, p["serving"]["max_model_len"])
    write_json("metrics/models.json", summary)
    drafted = f", draft = its first {cut.layers} layers" if cut is not None else ""
    pretrained = (f" (pretrained in {seconds['target']['train_s']:.0f} s and {seconds['draft']['train_s']:.0f} s)"
                  if seconds else "")
    say(f"models: target and draft from {target_src if target_src == 'demo' else 'their sources'}{pretrained}"
        f"{drafted}, compatible")


if __name__ == "__main__":
    main()
