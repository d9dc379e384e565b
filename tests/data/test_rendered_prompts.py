"""Warm-up prompts rendered once per tokenizer (issue #32): bundle@<variant> reads the rendering the first bundle
remembered instead of loading a tokenizer per bundle, and what it reads is what a render gives. Also the tokenizer
loader's direct path for tokenizers' generic backend, which must load what AutoTokenizer loads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.data.formatting import prompt_text
from pipeline.models.loading import load_tokenizer
from pipeline.release.warmup import rendered_prompts
from tiny_project import ROOT

CONVERSATIONS = [
    [{"role": "user", "content": "How do I rotate the API key?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reset my password."}],
]


def rendered_in_a_fresh_process(model_dir: Path, memory_dir: Path) -> tuple[list, bool]:
    """(the prompts, whether transformers was imported): a stage's view, in its own interpreter."""
    code = (
        "import json, sys; from pathlib import Path; from pipeline.release.warmup import rendered_prompts; "
        f"out = rendered_prompts(Path({str(model_dir)!r}), {CONVERSATIONS!r}, Path({str(memory_dir)!r})); "
        "print(json.dumps([out, 'transformers' in sys.modules]))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    prompts, imported = json.loads(r.stdout.splitlines()[-1])
    return [tuple(p) for p in prompts], imported


def test_a_remembered_rendering_is_the_render_and_loads_no_tokenizer(demo_pair, tmp_path):
    model = shutil.copytree(demo_pair[0], tmp_path / "model")
    tokenizer = load_tokenizer(model)
    expected = [prompt_text(tokenizer, c) for c in CONVERSATIONS]
    assert tokenizer.chat_template and not expected[0][1]  # rendered by the chat template, which carries its BOS
    first, imported = rendered_in_a_fresh_process(model, tmp_path / "memory")
    assert first == expected and imported  # rendered: the tokenizer was loaded
    again, imported = rendered_in_a_fresh_process(model, tmp_path / "memory")
    assert again == expected and not imported  # remembered: transformers never imported


def test_an_edited_memory_or_template_is_rendered_again(demo_pair, tmp_path):
    model = shutil.copytree(demo_pair[0], tmp_path / "model")
    memory = tmp_path / "memory"
    expected = rendered_prompts(model, CONVERSATIONS, memory)
    (stored,) = memory.iterdir()
    sealed = json.loads(stored.read_text())
    sealed["body"]["prompts"][0][0] = "forged"  # edited without resealing: not to be trusted
    stored.write_text(json.dumps(sealed))
    assert rendered_prompts(model, CONVERSATIONS, memory) == expected
    template = model / "chat_template.jinja"
    template.write_text("EDITED " + template.read_text())  # another template: another key, rendered with it
    edited = rendered_prompts(model, CONVERSATIONS, memory)
    assert [text for text, _ in edited] == ["EDITED " + text for text, _ in expected]
    assert len(list(memory.iterdir())) == 2


def test_the_generic_backend_loads_what_autotokenizer_loads(demo_pair):
    from transformers import AutoTokenizer

    model = demo_pair[0]
    assert json.loads((model / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    direct, auto = load_tokenizer(model), AutoTokenizer.from_pretrained(model)
    assert type(direct) is type(auto)
    for conversation in CONVERSATIONS:
        text = auto.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert direct.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False) == text
        assert direct(text)["input_ids"] == auto(text)["input_ids"]
    assert (direct.eos_token_id, direct.pad_token_id, direct.bos_token_id) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.bos_token_id,
    )
