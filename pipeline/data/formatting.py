"""Turn traffic rows into model inputs the way the served model will see them."""

from __future__ import annotations

from pipeline.core.errors import PipelineError


def row_to_messages(row: dict) -> list[dict]:
    """A traffic row as chat messages; accepts {prompt, response} or {messages: [...]}."""
    if "messages" in row:
        return [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    return [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}]


def split_prompt_response(messages: list[dict]) -> tuple[list[dict], str]:
    """Everything before the final assistant turn is the prompt; that turn is the response."""
    if not messages or messages[-1]["role"] != "assistant":
        raise PipelineError("a conversation must end with an assistant message")
    return messages[:-1], messages[-1]["content"]


def prompt_ids(tokenizer, prompt_messages: list[dict]) -> list[int]:
    """Token ids of the prompt, ending where the assistant's answer begins."""
    if tokenizer.chat_template:
        return list(
            tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    text = "\n".join(m["content"] for m in prompt_messages) + "\n"
    ids = tokenizer(text)["input_ids"]
    return ids


def prompt_text(tokenizer, prompt_messages: list[dict]) -> tuple[str, bool]:
    """(text, add_special_tokens): the prompt as a server receives it over the completions API, such
    that tokenizing text with that flag gives exactly prompt_ids (a chat template carries its own BOS)."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=False), False
    return "\n".join(m["content"] for m in prompt_messages) + "\n", True


def prompt_and_response_ids(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) such that their concatenation is the full formatted turn."""
    prompt_messages, response = split_prompt_response(messages)
    p = prompt_ids(tokenizer, prompt_messages)
    r = tokenizer(response, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        r = r + [tokenizer.eos_token_id]
    return p, r


def full_text(tokenizer, messages: list[dict]) -> str:
    """The whole conversation as text (used as calibration samples)."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(m["content"] for m in messages)
