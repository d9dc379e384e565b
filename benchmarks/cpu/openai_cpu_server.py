"""A small OpenAI-compatible completions server on CPU (transformers, greedy), for running the real
`vllm bench serve` client where vLLM's own server cannot run (no GPU). It is not vLLM and is never
used to measure speed: it exists so that the pipeline's load-generator command line, its result file
and the parser of that file are exercised by the real client on this machine.

    python benchmarks/cpu/openai_cpu_server.py serve --config F --host H --port P   # argv as `vllm serve`

The config file names the model directory and the served name (`model`, `served-model-name`, as in
serve.yaml); `fail-every: N` answers every Nth completion request with HTTP 500, so that failed
requests can be seen in the client's result. Endpoints: /health, /v1/models, /v1/completions (an SSE
stream with usage when asked to stream, else one JSON answer). Requests are served one at a time.
"""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from pathlib import Path

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(argv: list[str]) -> None:
    config = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text())
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    model_dir, name = config["model"], config["served-model-name"]
    fail_every = int(config.get("fail-every") or 0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lock, count = threading.Lock(), [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._json(200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                count[0] += 1
                failing = fail_every and count[0] % fail_every == 0
            if self.path != "/v1/completions" or body.get("model") != name:
                return self._json(404, {"error": f"no model {body.get('model')!r} at {self.path}"})
            if failing:
                return self._json(500, {"error": "injected failure (fail-every)"})
            ids = tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
            stream = bool(body.get("stream"))
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            produced = []
            with lock, torch.no_grad():  # one request at a time: a CPU reference, not a server to measure
                out = model(input_ids=torch.tensor([ids]), use_cache=True)
                for _ in range(int(body.get("max_tokens") or 16)):
                    token = int(out.logits[0, -1].argmax())
                    produced.append(token)
                    if stream:
                        self._chunk(
                            {"choices": [{"index": 0, "text": tokenizer.decode([token]), "finish_reason": None}]}
                        )
                    if token == tokenizer.eos_token_id:
                        break
                    out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
            usage = {
                "prompt_tokens": len(ids),
                "completion_tokens": len(produced),
                "total_tokens": len(ids) + len(produced),
            }
            if not stream:
                return self._json(
                    200,
                    {
                        "object": "text_completion",
                        "usage": usage,
                        "choices": [{"index": 0, "text": tokenizer.decode(produced), "finish_reason": "stop"}],
                    },
                )
            self._chunk({"choices": [], "usage": usage})
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, payload) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    print(f"serving {name} on {host}:{port}", flush=True)
    started = time.time()
    try:
        server.serve_forever()
    finally:
        print(f"stopped after {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: openai_cpu_server.py serve --config F --host H --port P")
    main(sys.argv[2:])
