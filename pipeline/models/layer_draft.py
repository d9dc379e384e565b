"""A draft cut from the target (draft.source {from: target, layers: N}): its embeddings, first N decoder layers,
final norm and head, with its tokenizer and config (num_hidden_layers N). For a team's own fine-tune there is
rarely a smaller sibling with the same tokenizer; the first layers of the target itself already predict some
of its tokens, and the distillation fine-tune (stages distill, draft_finetune) then trains them on the
target's answers.

Works on the safetensors tensors by name, so no model is instantiated: decoder layers are the tensors named
`<prefix>.layers.<i>.*` (every Llama-family checkpoint in transformers); anything else is refused in one line.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.models.sources import WEIGHTS, WEIGHTS_INDEX, model_files

LAYER_KEY = re.compile(r"^(?P<prefix>(?:.+\.)?layers)\.(?P<index>\d+)\.")
# Config lists with one entry per decoder layer (Qwen2/3 and Gemma's layer_types): cut to the draft's depth.
PER_LAYER_LISTS = ("layer_types",)


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / WEIGHTS_INDEX
    if index.is_file():
        return [model_dir / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [model_dir / WEIGHTS]


def build_layer_draft(target: Path, dst: Path, layers: int) -> dict:
    """Write the draft into dst (a fresh directory); returns its summary for metrics/models.json."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config_path = target / "config.json"
    config = json.loads(config_path.read_text())
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or isinstance(total, bool):
        raise PipelineError(
            "draft.source {from: target}: target config.json has no num_hidden_layers "
            "(a decoder-only text model is needed)"
        )
    if layers >= total:
        raise PipelineError(
            f"draft.source.layers is {layers}, but the target has {total} decoder layers "
            f"(config.json num_hidden_layers); a draft takes fewer: 1 to {total - 1}"
        )
    kept, seen = {}, defaultdict(set)
    for shard in weight_files(target):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                m = LAYER_KEY.match(key)
                if m:
                    seen[m["prefix"]].add(int(m["index"]))
                    if int(m["index"]) >= layers:
                        continue
                kept[key] = f.get_tensor(key)
    if len(seen) != 1 or next(iter(seen.values())) != set(range(total)):
        found = ", ".join(f"{p}.<0..{max(i)}>" for p, i in sorted(seen.items())) or "none"
        raise PipelineError(
            f"draft.source {{from: target}}: the target's weights do not hold its {total} decoder "
            f"layers as one <prefix>.layers.<i> sequence (found: {found}); this architecture needs "
            "a separate draft model"
        )
    dst.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(dst / WEIGHTS), metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    for key in PER_LAYER_LISTS:
        if isinstance(config.get(key), list) and len(config[key]) == total:
            config[key] = config[key][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for rel in model_files(target):  # tokenizer, chat template, generation_config: the target's own
        if rel == "config.json" or rel == WEIGHTS_INDEX or rel.endswith(".safetensors"):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / rel, dst / rel)  # small files; no links between two DVC outputs
    return {
        "kind": "target",
        "layers": layers,
        "of_target_layers": total,
        "parameters": sum(t.numel() for t in kept.values()),
    }
