"""Serving (stage serve_bench): the serving configuration a bundle ships, vLLM servers, the load benchmark,
capacity at the SLO and serving tiers."""
