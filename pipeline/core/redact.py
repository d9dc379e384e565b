"""Keep credentials out of messages, receipts and provenance: URL userinfo and secret-named params."""

from __future__ import annotations

import copy
import re

# scheme://userinfo@ : the userinfo runs to the last '@' before the host's end ('/', '?', '#' or
# whitespace), so a password holding an unescaped '@' is hidden whole.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# A secret-named query parameter's value: ?token=..., &api_key=..., &X-Amz-Signature=...
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;][A-Za-z0-9_.-]*?(?:token|password|passwd|secret|api_?key|signature|sig)"
    r"[A-Za-z0-9_.-]*=)[^&#;\s'\"]+",
    re.IGNORECASE,
)
# Whole words of a key (snake_case or camelCase), so counts such as max_new_tokens stay visible.
_SECRET_WORDS = re.compile(r"(?:^|_)(?:token|password|passwd|secret|api_?key)(?:_|$)")
REDACTED = "***"


def redact_uri(text: str) -> str:
    """`http://alice:s3cret@host:5000/x?token=abc` -> `http://***@host:5000/x?token=***`, for every URL in text."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}{REDACTED}", text)


def secret_paths(obj, path: str = "") -> list[str]:
    """Keys of a params tree whose string values carry credentials (URL userinfo, a secret query parameter):
    params end up in dvc.lock, the bundle's provenance and the logs, so secrets come from the environment."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in secret_paths(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in secret_paths(v, f"{path}[{i}]")]
    return [path] if isinstance(obj, str) and redact_uri(obj) != obj else []


def _secret_key(key) -> bool:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(key)).lower()
    return bool(_SECRET_WORDS.search(re.sub(r"[^a-z0-9]+", "_", words)))


def redact_params(obj):
    """A deep copy of a params tree: every string through redact_uri, and the value of every key
    naming a token, password, secret or api_key replaced by '***' (unset ones, empty mappings and lists included,
    stay as they are: `secret_env: {}` holds no secret and must read as empty)."""
    if isinstance(obj, dict):
        return {
            k: REDACTED if _secret_key(k) and v not in (None, "", {}, []) else redact_params(v) for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_params(v) for v in obj)
    if isinstance(obj, str):
        return redact_uri(obj)
    return copy.deepcopy(obj)
