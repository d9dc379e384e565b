"""Stage `eagle3`: an EAGLE-3 head for the target, trained on the target's own answers to domain prompts.

Runs when draft.method lists eagle3; otherwise records why no head was trained, and the evaluate and
serving stages leave the method out."""

from collections import Counter

from pipeline.core import paths, records
from pipeline.core.io import atomic_dir, write_csv, write_json
from pipeline.core.stage import progress, record_timings, say, stage_main
from pipeline.drafts import eagle3, methods
from pipeline.drafts.distill import read_examples
from pipeline.drafts.settings import DraftParams
from pipeline.models.loading import load_causal_lm
from pipeline.params.load import load_params, parse_section


@stage_main()
def main(argv: list[str]) -> None:
    draft = parse_section(load_params(), DraftParams)
    cfg = draft.eagle3  # None unless draft.method lists eagle3
    if cfg is None:
        record = eagle3.Eagle3Record(skipped=methods.not_requested(methods.EAGLE3))
        with atomic_dir(paths.EAGLE3) as tmp:
            records.write(tmp / "record.json", record)
        write_json("metrics/eagle3.json", {"skipped": record.skipped})
        write_csv("plots/eagle3_loss.csv", [], ["step", "loss"])
        say(f"eagle3: skipped ({record.skipped})")
        return
    target = load_causal_lm(paths.TARGET)  # the GPU where there is one
    device = target.device
    layer_ids = eagle3.aux_layer_ids(cfg.aux_layers, target.config.num_hidden_layers)  # errors before training
    rows = [{"input_ids": e["input_ids"], "labels": e["labels"]} for e in read_examples(paths.DISTILL / "train.jsonl")]
    answers = Counter(t for r in rows for t, label in zip(r["input_ids"], r["labels"]) if label != -100)
    head = eagle3.build_head(paths.TARGET, cfg, layer_ids, answers)
    result = eagle3.train(head, eagle3.TargetFeatures(target, layer_ids), rows, cfg, device, progress)
    last = result["curve"][-1]
    record = eagle3.Eagle3Record(
        aux_layers=layer_ids,
        draft_vocab_size=head.draft_vocab_size,
        ttt_steps=cfg.ttt_steps,
        train_steps=cfg.train_steps,
        trainable_parameters=result["trainable_parameters"],
        final_loss=last["loss"],
        accuracy_by_step=[last[f"accuracy_step{s}"] for s in range(cfg.ttt_steps)],
        device=str(device),
    )
    with atomic_dir(paths.EAGLE3) as tmp:
        eagle3.save(head.cpu(), tmp / "model", paths.TARGET)
        records.write(tmp / "record.json", record)
    write_json("metrics/eagle3.json", {k: v for k, v in vars(record).items() if v is not None})
    record_timings("eagle3", {"train_s": round(result["train_s"], 1)})
    write_csv("plots/eagle3_loss.csv", result["curve"])
    say(
        f"eagle3: {cfg.train_steps} steps in {result['train_s']:.0f} s on {device}, loss "
        f"{result['curve'][0]['loss']:.2f} -> {last['loss']:.2f}, step-1 accuracy {last['accuracy_step0'] or 0:.3f}"
    )


if __name__ == "__main__":
    main()
