"""Can this draft speculate for this target under vLLM? Checked from tokenizers and configs
alone, before any weights load or training starts.

vLLM's draft_model method compares token ids across the two models and refuses a pair whose
config vocab_size differs; a draft with another chat template or special tokens would be
trained on text laid out differently from what the target is served.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import PipelineError

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def max_positions(config) -> int | None:
    """The longest context a config declares, under the names common architectures use."""
    text = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if getattr(text, name, None):
            return int(getattr(text, name))
    return None


def check_tokenizers(target_tok, draft_tok) -> None:
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(target_vocab.items() - draft_vocab.items())
        raise PipelineError(
            f"draft tokenizer vocabulary differs from the target's ({differing} of the target's "
            f"{len(target_vocab)} tokens are missing from the draft's {len(draft_vocab)} or have other "
            "ids); vLLM speculative decoding needs an identical vocabulary, so pick a draft from the "
            "target's model family"
        )
    for attr in SPECIAL_IDS:
        if getattr(target_tok, attr) != getattr(draft_tok, attr):
            raise PipelineError(
                f"draft special token {attr} is {getattr(draft_tok, attr)}, the target's is "
                f"{getattr(target_tok, attr)}; the draft must share the target's special tokens"
            )
    if sorted(target_tok.all_special_tokens) != sorted(draft_tok.all_special_tokens):
        raise PipelineError(
            f"draft special tokens {sorted(draft_tok.all_special_tokens)} differ from the target's "
            f"{sorted(target_tok.all_special_tokens)}"
        )
    if (target_tok.chat_template or "") != (draft_tok.chat_template or ""):
        differs = template_difference(target_tok, draft_tok)
        if differs:
            raise PipelineError(
                f"draft chat template differs from the target's ({differs}); the draft would learn "
                "prompts laid out differently from how the target is served"
            )


# The conversations the pipeline lays out (pipeline/data/formatting.py: roles system, user, assistant; no tools),
# each rendered as a prompt and as a whole conversation. Two templates that differ as text but render these the same
# lay out every row alike (Qwen2.5-Coder 1.5B and 0.5B differ only in the braces of their tools branch, issue #45).
PROBES = (
    [{"role": "user", "content": "Write a function."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain x = 1."}],
    [
        {"role": "user", "content": "def f(a):"},
        {"role": "assistant", "content": "    return a"},
        {"role": "user", "content": "Add a docstring.\n  Keep it short."},
    ],
)


def template_difference(target_tok, draft_tok) -> str | None:
    """Where two chat templates lay out the probe conversations differently, in a few words; None where they agree."""
    from jinja2 import TemplateError

    for messages in PROBES:
        for ended in (False, True):
            convo = [*messages, {"role": "assistant", "content": "Done."}] if ended else messages
            try:
                shown = [
                    tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=not ended)
                    for tok in (target_tok, draft_tok)
                ]
            except (TemplateError, ValueError) as e:  # no template on one side, or one that refuses a probe
                return f"one of them cannot render a {len(convo)}-message conversation: {type(e).__name__}"
            if shown[0] != shown[1]:
                at = next((i for i, (a, b) in enumerate(zip(*shown)) if a != b), min(map(len, shown)))
                return f"a {len(convo)}-message conversation renders differently from character {at}"
    return None


def check_configs(target_config, draft_config, max_model_len: int) -> None:
    target_vocab, draft_vocab = target_config.get_text_config().vocab_size, draft_config.get_text_config().vocab_size
    if target_vocab != draft_vocab:
        raise PipelineError(
            f"draft vocab_size {draft_vocab} differs from the target's {target_vocab}; vLLM refuses "
            "a draft_model whose vocab_size differs from the target's"
        )
    positions = max_positions(draft_config)
    if positions is None:
        raise PipelineError(
            "draft config declares no max_position_embeddings; cannot confirm it covers the serving "
            f"max_model_len {max_model_len}"
        )
    if positions < max_model_len:
        raise PipelineError(
            f"draft max_position_embeddings {positions} is below the serving max_model_len "
            f"{max_model_len}; pick a draft with a longer context or lower serving.max_model_len"
        )


def check_compatible(target_dir: str | Path, draft_dir: str | Path, max_model_len: int) -> None:
    """Raise PipelineError with the first incompatibility found; reads no weights."""
    from transformers import AutoConfig

    from pipeline.models.loading import load_tokenizer

    check_tokenizers(load_tokenizer(target_dir), load_tokenizer(draft_dir))
    check_configs(
        AutoConfig.from_pretrained(target_dir, trust_remote_code=False),
        AutoConfig.from_pretrained(draft_dir, trust_remote_code=False),
        max_model_len,
    )
