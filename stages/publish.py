"""Stage `publish`: verify each bundle and push it to the configured registry."""
from pathlib import Path

from pipeline.config import load_params, one_line_errors
from pipeline.io import read_json, write_json
from pipeline.registry import get_backend


@one_line_errors
def main() -> None:
    p = load_params()
    pub, name = p["publish"], p["serving"]["name"]
    backend = get_backend(pub["backend"])
    gates = read_json("artifacts/gate/verdict.json")["variants"]
    receipts = []
    for variant in p["quantize"]["enabled"]:
        bundle = Path("artifacts/bundles") / variant
        manifest = read_json(bundle / "MANIFEST.json")
        version = manifest["bundle_digest"][:12] if pub["version"] == "auto" else str(pub["version"])
        summary = read_json(Path("artifacts/eval") / variant / "summary.json")
        tags = {"variant": variant, "gates": "passed" if gates[variant]["passed"] else "failed-allowed",
                "acceptance_rate": f"{summary['acceptance_rate']:.3f}",
                "num_speculative_tokens": str(summary["num_speculative_tokens"])}
        receipt = backend.publish(bundle, f"{name}-{variant}", version, tags, pub)
        receipts.append(receipt)
        print(f"publish {variant}: {receipt['status']} {receipt['name']} {receipt['version']} -> {receipt['uri']}")
    write_json("artifacts/publish/receipt.json", {"backend": pub["backend"], "published": receipts})


if __name__ == "__main__":
    main()
