"""A tiny ChatML Llama, as SmolLM2 is laid out (<|im_start|> 1 opens a turn, <|im_end|> 2 ends it), as a
transformers checkpoint or written as a GGUF file with the gguf package's own writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2, as SmolLM2's
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "how do I reset my password",
    "answers end with a token",
    "a draft model predicts the target's next tokens",
    "hello world, this is a tiny corpus for a tiny tokenizer",
]
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
)


def chatml_tokenizer():
    """A byte-level BPE with the ChatML special tokens first and the ChatML template; eos <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        TEXT * 4,
        trainer=trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=2048,
    )
    fast.chat_template = CHATML
    return fast


# tiny_params' quantize section for a project whose target is tiny_llama: params.yaml's INT4 group of 128 does not
# divide its 64-wide layers, which the TP choice refuses at `models`
TINY_GROUP = {"variants": {"gptq-w4a16": {"group_size": 64}}}


def tiny_llama(tokenizer, layers: int, tied: bool, seed: int = 0):
    """A randomly initialised Llama whose weights are exactly bf16 values (a bf16 checkpoint holds them as they are)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_hidden_layers=layers,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **SHAPE,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model.eval()


def save_checkpoint(directory: Path, model, tokenizer) -> Path:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute of q/k rows (transformers reverses it when it loads a GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path,
    model,
    tokenizer,
    eos_token_id: int = 2,
    pad_token_id: int | None = 2,
    merges: bool = True,
    vocabulary=None,
) -> Path:
    """model and tokenizer as a llama GGUF (F32 tensors, a "gpt2" BPE vocabulary, the ChatML template), as
    llama.cpp's converter lays one out: tensor names, q/k permutation, no output.weight when embeddings are tied.
    merges=False leaves tokenizer.ggml.merges empty (a broken BPE vocabulary); vocabulary(writer) writes another
    vocabulary instead (tests/tiny_spm.py's SentencePiece one)."""
    from gguf import GGUFWriter, LlamaFileType

    c = model.config
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    writer.add_vocab_size(c.vocab_size)
    writer.add_file_type(LlamaFileType.ALL_F32)
    if vocabulary is not None:
        vocabulary(writer)
    else:
        write_chatml_vocab(writer, tokenizer, eos_token_id, pad_token_id, merges)
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        layer = f"model.layers.{i}."
        for gguf_name, hf_name in (
            ("attn_norm", "input_layernorm"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ):
            writer.add_tensor(f"blk.{i}.{gguf_name}.weight", sd[layer + hf_name + ".weight"])
        writer.add_tensor(
            f"blk.{i}.attn_q.weight", permute(sd[layer + "self_attn.q_proj.weight"], c.num_attention_heads)
        )
        writer.add_tensor(
            f"blk.{i}.attn_k.weight", permute(sd[layer + "self_attn.k_proj.weight"], c.num_key_value_heads)
        )
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        writer.add_tensor("output.weight", sd["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_chatml_vocab(writer, tokenizer, eos_token_id: int, pad_token_id: int | None, merges: bool) -> None:
    """The ChatML tokenizer as a "gpt2" (byte-level BPE) GGUF vocabulary, as llama.cpp's converter writes SmolLM2's."""
    import json

    from gguf import TokenType

    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    pairs = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"] if merges else []
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in pairs])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos_token_id)
    if pad_token_id is not None:
        writer.add_pad_token_id(pad_token_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
