"""Warm a freshly started vLLM server before it takes traffic; shipped in every bundle as deploy/warmup.py.

The Kubernetes manifest starts it from the container's postStart hook; the readiness probe passes only
once it has written its marker file, so the pod receives traffic after CUDA graphs, compilation and
caches have been exercised by real held-out prompts, not on the first user's request. Standard library
only: it runs inside the stock vLLM image.

    python3 deploy/warmup.py --prompts deploy/warmup_prompts.jsonl --port 8000 --model NAME --marker /tmp/modelprep-warm
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def wait_healthy(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise SystemExit(f"warmup: {base}/health did not answer within {timeout_s:.0f} s")


def complete(base: str, model: str, prompt: str, max_tokens: int, add_special_tokens: bool) -> int:
    """One completion request; returns the completion tokens the server reports."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "add_special_tokens": add_special_tokens,
        }
    ).encode()
    request = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return int(json.loads(r.read())["usage"]["completion_tokens"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL of {prompt, add_special_tokens}")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--marker", default="/tmp/modelprep-warm", help="written once warm; the readiness probe checks it")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--health-timeout", type=float, default=3600)
    args = ap.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    wait_healthy(base, args.health_timeout)
    t0, tokens = time.monotonic(), 0
    for p in prompts:
        try:
            tokens += complete(base, args.model, p["prompt"], args.max_tokens, p.get("add_special_tokens", True))
        except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
            print(f"warmup: request failed: {e}", file=sys.stderr)
            return 1  # no marker: the pod stays unready and the failure is in the container's log
    Path(args.marker).write_text(
        json.dumps({"prompts": len(prompts), "completion_tokens": tokens, "seconds": round(time.monotonic() - t0, 2)})
    )
    print(f"warmup: {len(prompts)} prompts, {tokens} tokens in {time.monotonic() - t0:.1f} s; ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
