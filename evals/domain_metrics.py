"""Per-document scores for evals/domain_heldout.yaml.

lm-eval's built-in `perplexity` for loglikelihood tasks is exp(-mean log-likelihood per
*document*), which grows with response length and is not comparable across data sets. Byte
perplexity normalizes by the response's UTF-8 length, so it is independent of the tokenizer.
"""


def process_results(doc: dict, results: list) -> dict:
    loglikelihood, is_greedy = results[0]
    n_bytes = len(doc["response"].encode("utf-8"))
    return {
        "byte_perplexity": (loglikelihood, n_bytes),
        "bits_per_byte": (loglikelihood, n_bytes),
        "acc": int(is_greedy),
    }
