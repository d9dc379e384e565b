"""Synthetic-but-realistic domain traffic for the demo: a support / RAG assistant of a
fictional cloud provider ("Nimbus Cloud").

Answers are a deterministic function of the question's slots (product, task, error code,
plan), so a small model can learn the domain, a generic draft cannot guess it, and a
draft fine-tuned on the target's answers can. Everything is seeded: the same seed gives
the same file byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PRODUCTS = {
    "Nimbus Storage": "buckets",
    "Nimbus Compute": "instances",
    "Nimbus Database": "clusters",
    "Nimbus Queue": "queues",
    "Nimbus CDN": "distributions",
    "Nimbus Functions": "functions",
}

# task -> (console section, button, closing advice)
TASKS = {
    "rotate an API key": (
        "Security > API keys",
        "Rotate key",
        "Update every client that uses the old key within 24 hours, after which it stops working.",
    ),
    "enable automatic backups": (
        "Settings > Backups",
        "Enable backups",
        "Backups run nightly at 02:00 UTC and are kept for 14 days.",
    ),
    "restore from a backup": (
        "Settings > Backups",
        "Restore",
        "The restore creates a new resource; point your application at it once it shows Ready.",
    ),
    "resize": ("Settings > Capacity", "Change size", "Resizing takes about five minutes and keeps your data in place."),
    "invite a teammate": ("Team > Members", "Invite member", "The invitation link is valid for seven days."),
    "set up single sign-on": (
        "Team > Single sign-on",
        "Connect identity provider",
        "Test the login with a second account before you enforce SSO for everyone.",
    ),
    "change the region": (
        "Settings > Location",
        "Migrate region",
        "Migration copies your data first, so plan for a short read-only window.",
    ),
    "enable encryption at rest": (
        "Security > Encryption",
        "Enable encryption",
        "Existing data is encrypted in the background; there is no downtime.",
    ),
    "view usage metrics": (
        "Monitoring > Usage",
        "Open dashboard",
        "Metrics are updated every minute and kept for 90 days.",
    ),
    "delete": ("Settings > Danger zone", "Delete", "Deleted resources can be recovered for 72 hours from the trash."),
    "add a custom domain": (
        "Networking > Domains",
        "Add domain",
        "Create the CNAME record shown on screen; verification usually takes a few minutes.",
    ),
    "set a spending alert": (
        "Billing > Alerts",
        "New alert",
        "Alerts are sent by email and to any webhook you configure.",
    ),
}

ERRORS = {
    "E1001": ("the API key is missing or expired", "Create a new key under Security > API keys and retry the request."),
    "E1007": ("the request was rate limited", "Retry with exponential backoff, or ask support to raise your quota."),
    "E2003": ("the resource is in another region", "Use the endpoint of the region that holds the resource."),
    "E2010": (
        "the quota for this resource type is exhausted",
        "Delete unused resources or request a quota increase under Billing > Quotas.",
    ),
    "E3002": ("the payload is larger than 10 MB", "Split the upload into parts or use the multipart upload API."),
    "E3015": (
        "the TLS certificate could not be validated",
        "Check that the custom domain's CNAME record points to Nimbus and wait for renewal.",
    ),
    "E4004": (
        "the resource does not exist or was deleted",
        "Check the resource name; deleted resources can be restored from the trash for 72 hours.",
    ),
    "E5000": ("an internal error occurred", "Retry the request; if it persists, open a ticket with the request ID."),
}

PLANS = {
    "Starter": ("$0 per month", "1 project", "community support", "99.5%"),
    "Team": ("$49 per month", "10 projects", "email support within one business day", "99.9%"),
    "Business": ("$399 per month", "unlimited projects", "24/7 support with a one-hour response time", "99.95%"),
    "Enterprise": ("custom pricing", "unlimited projects", "a named technical account manager", "99.99%"),
}

HOWTO_PHRASES = [
    "How do I {task} in {product}?",
    "How can I {task} for my {product} {noun}?",
    "What are the steps to {task} in {product}?",
    "Can you tell me how to {task} with {product}?",
    "I need to {task} in {product}. How?",
]
ERROR_PHRASES = [
    "I'm getting error {code} from {product}. What does it mean?",
    "{product} returns {code} when I call the API. How do I fix it?",
    "What does error code {code} mean in {product}?",
    "Our deploy fails with {code} on {product}. Any idea?",
]
PLAN_PHRASES = [
    "What is the difference between the {a} and {b} plans?",
    "Should I pick {a} or {b}?",
    "Compare the {a} plan with the {b} plan.",
]


def _howto(rng: random.Random) -> dict:
    product, noun = rng.choice(list(PRODUCTS.items()))
    task = rng.choice(list(TASKS))
    section, button, advice = TASKS[task]
    prompt = rng.choice(HOWTO_PHRASES).format(task=task, product=product, noun=noun[:-1])
    response = (
        f"To {task} in {product}: 1. Open the {product} console and select your {noun[:-1]}. "
        f"2. Go to {section}. 3. Click {button} and confirm. {advice}"
    )
    return {"prompt": prompt, "response": response}


def _error(rng: random.Random) -> dict:
    product = rng.choice(list(PRODUCTS))
    code = rng.choice(list(ERRORS))
    meaning, fix = ERRORS[code]
    prompt = rng.choice(ERROR_PHRASES).format(code=code, product=product)
    response = (
        f"Error {code} means that {meaning}. {fix} If it keeps happening, contact {product} support "
        "with the request ID."
    )
    return {"prompt": prompt, "response": response}


def _plans(rng: random.Random) -> dict:
    a, b = rng.sample(list(PLANS), 2)
    pa, pb = PLANS[a], PLANS[b]
    prompt = rng.choice(PLAN_PHRASES).format(a=a, b=b)
    response = (
        f"The {a} plan costs {pa[0]} and includes {pa[1]}, {pa[2]} and a {pa[3]} uptime SLA. "
        f"The {b} plan costs {pb[0]} and includes {pb[1]}, {pb[2]} and a {pb[3]} uptime SLA."
    )
    return {"prompt": prompt, "response": response}


def _rag(rng: random.Random) -> dict:
    """Retrieval-augmented: the answer must be read from the supplied context."""
    code = rng.choice(list(ERRORS))
    meaning, fix = ERRORS[code]
    product = rng.choice(list(PRODUCTS))
    context = f"[doc: {product} errors] {code}: {meaning}. Resolution: {fix}"
    prompt = f"Context: {context}\nQuestion: According to the documentation, how do I resolve {code}?"
    response = f"According to the {product} documentation, {code} occurs when {meaning}. {fix}"
    return {"prompt": prompt, "response": response}


KINDS = [(_howto, 0.45), (_error, 0.25), (_plans, 0.1), (_rag, 0.2)]


def generate_traffic(n_rows: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    makers, weights = zip(*KINDS)
    rows = []
    for _ in range(n_rows):
        row = rng.choices(makers, weights)[0](rng)
        # Production logs mix formats: a share arrives as chat messages.
        if rng.random() < 0.15:
            row = {
                "messages": [
                    {"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["response"]},
                ]
            }
        rows.append(row)
    return rows


GENERAL_SUBJECTS = [
    "The river",
    "A small village",
    "The old library",
    "Our team",
    "The morning train",
    "A local bakery",
    "The museum",
    "The mountain trail",
    "The city council",
    "A new student",
]
GENERAL_VERBS = [
    "opened",
    "closed",
    "welcomed",
    "crossed",
    "announced",
    "visited",
    "described",
    "painted",
    "followed",
    "remembered",
]
GENERAL_OBJECTS = [
    "a quiet garden",
    "the annual festival",
    "a short story",
    "the northern bridge",
    "an evening concert",
    "the history of the town",
    "a plan for the summer",
    "the first snow",
    "a map of the valley",
    "the market square",
]


def generate_general_text(n_sentences: int, seed: int) -> list[str]:
    """Generic prose, not about the product: what a general-purpose draft was trained on."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(GENERAL_SUBJECTS)} {rng.choice(GENERAL_VERBS)} {rng.choice(GENERAL_OBJECTS)} "
        f"{rng.choice(['yesterday', 'last week', 'in the spring', 'every year', 'at dawn'])}."
        for _ in range(n_sentences)
    ]


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


if __name__ == "__main__":  # regenerate the shipped demo file: python -m pipeline.models.demo.traffic
    out = Path(__file__).resolve().parents[3] / "data" / "demo" / "traffic.jsonl"
    write_jsonl(generate_traffic(1200, seed=7), out)
    print(f"wrote {out}")
