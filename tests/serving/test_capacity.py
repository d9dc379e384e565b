"""Capacity at the SLO: the bounded search over loads, the record it leaves, the gate on it and its plots.

The server is the deterministic latency model of latency_model.py (latency rising with load, as a GPU's does): what
is under test is the search (pipeline/serving/capacity.py) and what the pipeline decides from its result, not `vllm
bench serve`, which only a GPU host runs (pipeline/serving/sweep.py calls the search with a probe that runs it)."""

from __future__ import annotations

import json

import pytest

from eval_helpers import eval_summaries, gate_report
from latency_model import CHAT, SWEEP, Server, search, searched_record, swept
from pipeline.core import records
from pipeline.core.errors import PipelineError
from pipeline.release import gates
from pipeline.serving import capacity, load_generator, sweep
from pipeline.serving.bench_record import AT_BOUND, BRACKET, FOUND, NEVER, PLAIN, ServeBenchRecord, ServeConfigResult
from pipeline.serving.capacity import CONCURRENCY, POISSON
from pipeline.serving.settings import ServeBenchParams
from pipeline.serving.tiers import Slo
from tiny_project import ROOT, serving_of, tiny_params

# ---- the search


def test_bisection_finds_the_boundary_from_the_sweeps_bracket():
    server = Server()
    found = search(server, gpus=2)
    # the sweep met the SLO up to 64: double to 128 (missed), then bisect to within 5% of the boundary at 80
    assert server.asked == [128, 96, 80, 88, 84]
    assert found.status == FOUND and found.load == 80 and found.ceiling == 84 and not found.lower_bound
    assert found.users == 80 and found.users_per_gpu == 40 and found.gpus == 2
    assert found.level.concurrency == 80 and found.request_goodput == 40.0
    assert found.output_tokens_per_s_per_gpu == pytest.approx(100.0 * 80**0.8 / 2)
    assert [lvl.concurrency for lvl in found.probes] == server.asked  # the sweep's levels are not probes


def test_ttft_binds_when_it_is_the_tighter_objective_and_the_probes_start_below_a_missing_sweep_level():
    server = Server(itl_slope=0.1, ttft_slope=5.0)  # TTFT 20 + 5c <= 200: c <= 36; c=64 of the sweep misses
    found = search(server)
    assert server.asked[0] == 48 and found.status == FOUND and 34 <= found.load <= 36  # within 5% (floor 1 user)
    assert found.load == max(c for c in [*SWEEP, *server.asked] if 20 + 5 * c <= 200)


def test_the_search_respects_its_bounds():
    server = Server()
    assert search(server, max_probes=2).status == BRACKET and server.asked == [128, 96]  # out of probes
    short = search(Server(), max_probes=2)
    assert (short.load, short.ceiling) == (64, 96) and not short.lower_bound
    server = Server()
    capped = search(server, bound=48)  # a sweep level above the bound is not evidence for it
    assert server.asked == [48] and capped.status == AT_BOUND and capped.load == 48 and capped.lower_bound
    server = Server()
    none = search(server, max_probes=0)
    assert server.asked == [] and none.status == BRACKET and none.load == 64 and none.ceiling is None
    assert none.lower_bound  # the sweep still met it at its top: at least 64


def test_a_load_that_meets_the_slo_at_the_bound_is_at_least_the_bound():
    server = Server(itl_slope=0.01, ttft_slope=0.1)
    found = search(server)
    assert server.asked == [128, 256] and found.status == AT_BOUND and found.load == 256 and found.lower_bound


def test_one_user_already_missing_the_slo_is_no_capacity_and_costs_no_probe():
    server = Server()
    strict = Slo(p99_ttft_ms=5, p99_itl_ms=50)
    found = search(server, slo=strict)
    assert found.status == NEVER and found.load == 0 and found.users_per_gpu == 0 and found.level is None
    assert server.asked == [] and found.output_tokens_per_s_per_gpu is None
    # without a sweep, the search measures one user first
    server = Server()
    assert search(server, slo=strict, known=[]).status == NEVER and server.asked == [1]


def test_failed_requests_miss_the_slo_whatever_the_latencies():
    server = Server(fail_above=40)
    found = search(server)
    assert found.load == 40 and found.status == FOUND
    assert Slo(200, 50).misses(server.closed(48)) == ["2 failed requests"]


def test_a_probe_that_fails_to_run_stops_the_search_with_what_it_measured():
    server = Server(die_above=100)
    found = search(server)
    assert server.asked == [128] and found.status == BRACKET and found.load == 64 and found.lower_bound
    assert found.note.startswith("the search stopped at load 128: `vllm bench serve` failed")


def test_poisson_arrivals_are_searched_by_rate_from_the_sweeps_seed():
    server = Server()
    seed, floor = capacity.open_loop_seed(server.sweep(), CHAT)
    assert seed == 32.0 and floor is True  # c=64 sustained 32 req/s within the SLO; one user at a time meets it
    found = capacity.search(
        lambda r: server.probe(r, POISSON), CHAT, POISSON, 64.0, 8, known=server.sweep(), seed=seed, floor_meets=floor
    )
    assert server.asked[0] == 32.0 and all(r <= 64.0 for r in server.asked)
    assert found.status == FOUND and 19.0 <= found.load <= 20.0 and found.ceiling - found.load <= 0.05 * found.load
    assert found.users == pytest.approx(found.load * 1500.0 / 2 / 1000)  # Little's law: rate x mean latency
    assert all(lvl.request_rate is not None for lvl in found.probes)  # closed-loop levels are not rate evidence
    never = capacity.search(lambda r: server.probe(r, POISSON), Slo(5, 50), POISSON, 64.0, 8, floor_meets=False)
    assert never.status == NEVER and never.probes == []


def test_another_objective_is_read_from_the_measurements_already_taken():
    server = Server()
    config = ServeConfigResult(0, 30.0, swept(server), capacity=search(server))
    assert capacity.users_meeting(config, CHAT) == (80, False)
    # a looser tier objective: every measurement met it, so at least the largest one
    assert capacity.users_meeting(config, Slo(2000, 500)) == (128, True)
    assert capacity.users_meeting(config, Slo(200, 20)) == (8, False)  # ITL 10 + 0.5c <= 20 up to 20: 8 measured
    assert capacity.users_meeting(ServeConfigResult(0, 1.0, {}), CHAT) is None  # not searched


# ---- the record


def test_a_searched_record_round_trips_and_an_older_one_still_reads(tmp_path):
    record = searched_record("bf16", Server(), spec_server=Server(itl_slope=0.25))
    records.write(tmp_path / "serve.json", record)
    back = records.read(ServeBenchRecord, tmp_path / "serve.json")
    assert back == record and isinstance(back.configs[PLAIN].capacity.slo, Slo)
    assert back.configs[PLAIN].capacity.probes[0].request_goodput is not None
    raw = json.loads((tmp_path / "serve.json").read_text())
    for config in raw["configs"].values():  # as serve_bench wrote records before the capacity search
        del config["capacity"]
        for lvl in config["levels"].values():
            del lvl["request_rate"], lvl["request_goodput"]
    del raw["tensor_parallel_size"]
    (tmp_path / "old.json").write_text(json.dumps(raw))
    old = records.read(ServeBenchRecord, tmp_path / "old.json")
    assert old.configs[PLAIN].capacity is None and old.tensor_parallel_size is None
    raw["configs"][PLAIN]["capacity"] = {"arrival": "concurrency"}  # a broken one is one line naming the field
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(PipelineError, match=r"bad.json: configs.plain: capacity: missing field 'slo'"):
        records.read(ServeBenchRecord, tmp_path / "bad.json")


def test_bench_command_sends_poisson_arrivals_and_the_goodput_objectives(tmp_path):
    args = load_generator.bench_command(
        ["vllm"],
        "http://127.0.0.1:8000",
        load_generator.LoadSpec(
            "m",
            tmp_path,
            tmp_path / "p.jsonl",
            256,
            900,
            128,
            0.0,
            False,
            tmp_path / "r.json",
            request_rate=12.5,
            goodput=CHAT.goodput(),
        ),
    )
    flag = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--") and i + 1 < len(args)}
    assert flag["--request-rate"] == "12.5" and flag["--burstiness"] == "1.0" and flag["--max-concurrency"] == "256"
    assert args[args.index("--goodput") + 1 : args.index("--goodput") + 3] == ["ttft:200", "tpot:50"]
    closed = load_generator.bench_command(
        ["vllm"], "u", load_generator.LoadSpec("m", tmp_path, tmp_path, 8, 32, 128, 0.0, False, tmp_path / "r")
    )
    assert closed[closed.index("--request-rate") + 1] == "inf" and "--goodput" not in closed
    raw = json.loads((ROOT / "benchmarks/cpu/raw/vllm-bench-serve/ok-c4.json").read_text())
    assert load_generator.parse_result(raw, "x").request_rate is None  # "inf": a closed loop
    lvl = load_generator.parse_result({**raw, "request_rate": 12.5, "request_goodput": 11.0}, "x")
    assert (lvl.request_rate, lvl.request_goodput) == (12.5, 11.0)


def test_a_load_level_is_a_closed_loop_of_users_or_a_poisson_probe_under_the_capacity_cap(tmp_path):
    """load_generator.level_command, which the stage and benchmarks/gpu/serve_shipped.py both run: a concurrency is that
    many users; a Poisson probe's load is its rate, with at most serve_bench.capacity.max_concurrency open."""
    cfg = ServeBenchParams.parse(tiny_params()["serve_bench"])
    traffic = load_generator.Traffic(tmp_path / "prompts.jsonl", tmp_path / "model", True)

    def flags(**kw):
        client = load_generator.Client("m", traffic, cfg, temperature=0.0, goodput=CHAT.goodput())
        args = load_generator.level_command("http://127.0.0.1:8000", client, tmp_path / "raw/c4.json", prompts=40, **kw)
        return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--") and i + 1 < len(args)}

    users = flags(load=4.0, warmups=2)
    assert (users["--max-concurrency"], users["--request-rate"], users["--num-warmups"]) == ("4", "inf", "2")
    assert (users["--dataset-path"], users["--tokenizer"]) == (str(traffic.dataset), str(traffic.tokenizer_dir))
    assert users["--extra-body"] == '{"add_special_tokens": true}' and users["--result-filename"] == "c4.json"
    assert users["--custom-output-len"] == str(cfg.max_tokens)
    probe = flags(load=2.5, poisson=True)
    assert probe["--request-rate"] == "2.5" and probe["--max-concurrency"] == str(cfg.capacity.max_concurrency)


def test_pareto_rows_hold_every_measurement_and_the_slo_line():
    record = searched_record("bf16", Server(), spec_server=Server(itl_slope=0.25))
    rows, header = capacity.pareto_rows(record, CHAT)
    assert header == ["p99_token_latency_ms", "config", "output_tokens_per_s_per_gpu"]
    plain = [r for r in rows if r["config"] == PLAIN]
    assert len(plain) == len(SWEEP) + len(record.configs[PLAIN].capacity.probes)
    k = record.configs["draft_model"].num_speculative_tokens
    assert {r["config"] for r in rows} == {PLAIN, f"draft_model k={k}", "SLO p99 ITL 50 ms"}
    line = [r for r in rows if r["config"].startswith("SLO")]
    assert [r["p99_token_latency_ms"] for r in line] == [50, 50] and line[0]["output_tokens_per_s_per_gpu"] == 0.0
    assert line[1]["output_tokens_per_s_per_gpu"] == max(r["output_tokens_per_s_per_gpu"] for r in rows)
    assert capacity.pareto_rows(ServeBenchRecord("bf16", skipped="no CUDA device"), CHAT) == (
        [],
        ["p99_token_latency_ms", "config", "output_tokens_per_s_per_gpu"],
    )


def test_pareto_png_draws_every_variant_or_says_why_not(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pareto.png"
    assert (
        capacity.pareto_png(out, {"bf16": ServeBenchRecord("bf16", skipped="no CUDA device")}, CHAT)
        == "no serving benchmark measured"
    )
    assert not out.exists()
    recs = {"bf16": searched_record("bf16", Server()), "gptq-w4a16": searched_record("gptq-w4a16", Server(speed=180))}
    assert capacity.pareto_png(out, recs, CHAT) is None
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the gate


BF16, INT4 = "bf16", "gptq-w4a16"


def gate(params, serve):
    metrics = {
        v: {
            "perplexity_increase_pct": 0.5,
            "kl_divergence": 0.01,
            "top1_agreement": 0.97,
            "accepted_per_draft_token": 0.8,
            "estimated_num_speculative_tokens": 4,
            "estimated_speedup": 2.5,
        }
        for v in serve
    }
    return gate_report(params, eval_summaries(metrics), serve_by_variant=serve)


def test_capacity_gate_passes_fails_and_says_why_it_was_skipped():
    p = tiny_params(quantize={"enabled": [BF16, INT4]}, serving={"gpu_hour_cost": 4.0})
    base = searched_record(BF16, Server())  # 80 users
    more = gate(p, {BF16: base, INT4: searched_record(INT4, Server(itl_slope=0.25, ttft_slope=1.0))})
    v = more.variants[INT4]
    check = {c.check: c for c in v.checks}["min_capacity_vs_bf16"]
    assert check.passed and check.value == pytest.approx(160 / 80) and check.metric == "capacity_vs_bf16"
    claim = v.capacity
    assert claim.users_per_gpu == 160 and claim.baseline_users_per_gpu == 80 and claim.vs_bf16_bound is None
    tokens = 100.0 * 160**0.8
    assert claim.cost_per_million_output_tokens == pytest.approx(4.0 / (tokens * 3600) * 1e6)
    summary = next(s for s in gates.summary(more)["variants"] if s["variant"] == INT4)
    assert summary["capacity"]["vs_bf16"] == pytest.approx(2.0) and summary["capacity"]["users_per_gpu"] == 160

    fewer = gate(p, {BF16: base, INT4: searched_record(INT4, Server(itl_slope=1.0))})  # 10 + c <= 50: 40 users
    v = fewer.variants[INT4]
    assert not v.passed and [c.check for c in v.checks if c.failed] == ["min_capacity_vs_bf16"]
    assert "capacity_vs_bf16=0.5, needs >= 1.0 (short by 0.5)" in gates.failed_checks(fewer, allowed=False)[0]

    # measured on another GPU: no ratio, and the reason says so
    other = gate(p, {BF16: base, INT4: searched_record(INT4, Server(), gpu="NVIDIA A100")})
    check = {c.check: c for c in other.variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.passed is None and check.skipped == (
        "not measured: no capacity of bf16 plain decoding on the same GPU and vLLM"
    )
    # the CPU case: nothing measured
    cpu = gate(
        p,
        {
            BF16: ServeBenchRecord(BF16, skipped="no CUDA device"),
            INT4: ServeBenchRecord(INT4, skipped="no CUDA device"),
        },
    )
    check = {c.check: c for c in cpu.variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.skipped == "not measured: no CUDA device" and cpu.variants[INT4].capacity is None
    # served, but the capacity was not searched (serve_bench.capacity.enabled: false)
    unsearched = ServeBenchRecord(
        INT4,
        gpu=base.gpu,
        vllm_version="0.26.0",
        configs={PLAIN: ServeConfigResult(0, 90.0, base.configs[PLAIN].levels)},
    )
    check = {c.check: c for c in gate(p, {BF16: base, INT4: unsearched}).variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.skipped == "not measured: no capacity search of the plain config that ships (serve_bench.capacity)"


def test_a_ratio_resting_on_a_lower_bound_decides_only_when_the_bound_does():
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    base = searched_record(BF16, Server())  # 80 users, exact
    # the variant's search ran out of probes while still meeting the SLO at 64: at least x0.8, undecided against 1.0
    short = gate(p, {BF16: base, INT4: searched_record(INT4, Server(itl_slope=0.1), max_probes=0)})
    check = {c.check: c for c in short.variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.passed is None and check.skipped.startswith("not measured: undecided: the ratio is at least x0.80")
    assert short.variants[INT4].capacity.vs_bf16_bound == gates.AT_LEAST
    # at least x1.6 (met at the bound 128) against 1.0: a pass whatever the true capacity
    capped = gate(p, {BF16: base, INT4: searched_record(INT4, Server(itl_slope=0.1, ttft_slope=0.1), bound=128)})
    check = {c.check: c for c in capped.variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.passed and not check.skipped and check.value == pytest.approx(1.6)
    never = gate(p, {BF16: searched_record(BF16, Server(ttft_slope=300.0)), INT4: base})
    check = {c.check: c for c in never.variants[INT4].checks}["min_capacity_vs_bf16"]
    assert check.skipped == (
        "not measured: bf16 plain decoding met the SLO at no load (p99 TTFT <= 200 ms, p99 ITL <= 50 ms)"
    )


# ---- params


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p["serving"]["slo"].update(p99_ttft_ms=-1), r"serving.slo.p99_ttft_ms must be a positive number"),
        (lambda p: p["serving"]["slo"].update(p99_itl_ms=None), r"serving.slo: set p99_itl_ms or p99_tpot_ms"),
        (lambda p: p["serving"]["slo"].update(arrival="bursty"), r"serving.slo.arrival is 'bursty'; allowed: enum"),
        (lambda p: p["serving"]["slo"].update(p99_e2el_ms=9), r"unknown key serving.slo.p99_e2el_ms"),
        (
            lambda p: p["serving"]["tiers"]["throughput"].update(slo={"p99_ttft_ms": "1s"}),
            r"serving.tiers.throughput.slo.p99_ttft_ms must be a positive number",
        ),
        (
            lambda p: p["serving"]["tiers"]["throughput"].update(slo={"arrival": "poisson"}),
            r"serving.tiers.throughput.slo: unknown keys \['arrival'\]",
        ),
        (lambda p: p["serving"].update(gpu_hour_cost=-2), r"serving.gpu_hour_cost is -2; allowed: type"),
        (lambda p: p["serve_bench"]["capacity"].update(max_probes=-1), r"serve_bench.capacity.max_probes is -1"),
        (lambda p: p["serve_bench"]["capacity"].pop("max_rate"), r"serve_bench.capacity: 'max_rate' is a required"),
        (
            lambda p: p["deploy"]["autoscale"].update(target_utilization=1.0),
            r"deploy.autoscale.target_utilization is 1.0; allowed: type number, exclusiveMinimum 0, exclusiveMaximum 1",
        ),
        (lambda p: p["deploy"]["autoscale"].update(tiers=["thruput"]), r"deploy.autoscale.tiers names unknown tiers"),
        (
            lambda p: p["deploy"].update(tiers=["default", "latency"]),
            r"deploy.autoscale.tiers names \['throughput'\], which deploy.tiers does not render",
        ),
        (lambda p: p["deploy"]["autoscale"].update(min_replicas=5), r"deploy.autoscale.min_replicas \(5\) exceeds"),
    ],
)
def test_bad_capacity_params_are_one_line(edit, message, tmp_path):
    from pipeline.rules import validate

    p = tiny_params()
    edit(p)
    with pytest.raises(PipelineError, match=message) as err:
        validate(p, tmp_path / "params.yaml")
    assert "\n" not in str(err.value)


def test_the_shipped_params_validate_with_the_capacity_sections(tmp_path):
    from pipeline.rules import validate
    from pipeline.serving.tiers import parse_tiers

    p = tiny_params()
    p["serving"]["tiers"]["batch"] = {"max_num_seqs": 256, "concurrency": 64, "slo": {"p99_ttft_ms": 2000}}
    validate(p, tmp_path / "params.yaml")
    assert (serving_of(p).slo, serving_of(p).arrival) == (CHAT, CONCURRENCY)
    tiers = {t.name: t for t in parse_tiers(serving_of(p))}
    assert tiers["batch"].slo == Slo(2000, 50) and tiers["throughput"].slo == CHAT


def test_dvc_yaml_plots_the_columns_the_stage_writes():
    """serve_bench's plots in dvc.yaml name the columns plot_rows and pareto_rows write, and the template's line
    per config reads the config column they fill."""
    import yaml

    plots = {
        k: v
        for p in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["serve_bench"]["do"]["plots"]
        for k, v in p.items()
    }
    measured = searched_record("bf16", Server())
    written = {f"{d}/${{item}}": sweep.plot_rows(measured, *curve)[1] for d, curve in sweep.PLOTS.items()}
    written["plots/serve_pareto/${item}"] = capacity.pareto_rows(measured, CHAT)[1]
    assert set(plots) == set(written)
    template = json.loads((ROOT / ".dvc" / "plots" / "lines_by_config.json").read_text())
    for path, spec in plots.items():
        assert [spec["x"], template["encoding"]["color"]["field"], spec["y"]] == written[path], path


def test_speculation_that_carries_fewer_users_than_the_floor_gives_way_to_plain_decoding():
    """Faster per request but fewer users at the SLO: where plain decoding carries min_capacity_vs_bf16 it ships
    instead (the card says why) and the variant passes; where plain decoding falls short too, the variant fails."""
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    base = searched_record(BF16, Server())  # 80 users
    # the draft: twice the tokens/s, but its ITL rises four times as fast: 10 + 2c <= 50 holds to 20 users
    spec = searched_record(INT4, Server(), spec_server=Server(itl_slope=2.0, speed=200.0))
    v = gate(p, {BF16: base, INT4: spec}).variants[INT4]
    assert v.passed and v.speculation.num_speculative_tokens == 0 and v.speculation.method == "draft_model"
    assert (
        "not shipped: min_capacity_vs_bf16: draft_model carries x0.25 of bf16 plain decoding's users"
        in v.speculation.reason
    )
    assert v.capacity.config == PLAIN and v.capacity.vs_bf16 == pytest.approx(1.0)
    assert v.speculation.turned_off_by == ["min_capacity_vs_bf16"]
    assert gates.verdict_line(INT4, v).endswith(
        "; ships without speculation (measured; draft_model k=4 gave way: "
        "fewer users at the SLO than min_capacity_vs_bf16)"
    )
    # plain decoding of this variant carries fewer users than BF16's too: nothing to give way to, the variant fails
    slow = searched_record(INT4, Server(itl_slope=1.0), spec_server=Server(itl_slope=2.0, speed=200.0))
    v = gate(p, {BF16: base, INT4: slow}).variants[INT4]
    assert not v.passed and v.speculation.num_speculative_tokens == 4 and v.speculation.turned_off_by == []
    assert [c.check for c in v.checks if c.failed] == ["min_capacity_vs_bf16"]


# ---- per GPU: each variant at its own GPUs per replica


def test_the_gate_compares_per_gpu_a_variant_on_two_gpus_against_bf16_on_four():
    """Per replica the W4A16 variant on two GPUs carries the users BF16 carries on four (x1.0, which a per-server
    comparison would call a tie); per GPU it carries twice as many, at half the cost per output token. FP8 on one GPU
    carries half a replica's users but on a quarter of the GPUs: the most tokens per GPU, the cheapest, the pick."""
    FP8 = "fp8-dynamic"
    p = tiny_params(quantize={"enabled": [BF16, INT4, FP8]}, serving={"gpu_hour_cost": 4.0})
    serve = {
        BF16: searched_record(BF16, Server(), gpus=4),  # 80 users per replica
        INT4: searched_record(INT4, Server(), gpus=2),  # 80 users per replica
        FP8: searched_record(FP8, Server(itl_slope=1.0), gpus=1),
    }  # 40 users per replica
    report = gate(p, serve)
    int4, fp8 = report.variants[INT4].capacity, report.variants[FP8].capacity
    assert (int4.users, int4.gpus, int4.users_per_gpu) == (80, 2, 40) and int4.baseline_gpus == 4
    assert {c.check: c for c in report.variants[INT4].checks}["min_capacity_vs_bf16"].value == pytest.approx(2.0)
    replica = 100.0 * 80**0.8  # output tokens/s of one replica at 80 users, either variant
    assert int4.output_tokens_per_s_per_gpu == pytest.approx(replica / 2)
    assert int4.cost_per_million_output_tokens == pytest.approx(4.0 * 2 / (replica * 3600) * 1e6)
    assert int4.baseline_cost_per_million_output_tokens == pytest.approx(4.0 * 4 / (replica * 3600) * 1e6)
    assert int4.cost_vs_bf16 == pytest.approx(0.5)
    assert fp8.cost_vs_bf16 == pytest.approx((replica / 4) / (100.0 * 40**0.8))

    assert [(r.variant, r.gpus) for r in report.per_gpu] == [(FP8, 1), (INT4, 2), (BF16, 4)]
    assert report.recommended == FP8
    summary = gates.summary(report)
    assert summary["recommended"] == {
        "variant": FP8,
        "config": PLAIN,
        "gpus": 1,
        "output_tokens_per_s_per_gpu": pytest.approx(100.0 * 40**0.8),
        "cost_per_million_output_tokens": fp8.cost_per_million_output_tokens,
    }
    assert gates.recommendation_line(report).startswith(
        f"gate: lowest cost per output token at the SLO: {FP8} (plain) on 1 GPU per replica; per GPU: {FP8} "
    )

    # a variant that failed its gates is ranked, never recommended; without a price, tokens per GPU still rank
    p = tiny_params(quantize={"enabled": [BF16, INT4, FP8]}, gates={"overrides": {FP8: {"max_kl_divergence": 0.001}}})
    report = gate(p, serve)
    assert not report.variants[FP8].passed and report.per_gpu[0].variant == FP8 and report.recommended == INT4
    assert report.per_gpu[0].cost_per_million_output_tokens is None


def test_no_recommendation_across_gpus_or_where_a_search_stopped_at_its_bound():
    p = tiny_params(quantize={"enabled": [BF16, INT4]})
    other = gate(
        p,
        {
            BF16: searched_record(BF16, Server(), gpus=4),
            INT4: searched_record(INT4, Server(), gpu="NVIDIA A100", gpus=2),
        },
    )
    assert other.recommended is None and other.recommended_note.startswith("measured on different GPUs or vLLM")
    # bf16 ranks below int4 but still met the SLO at its search's bound (128 users): it may carry more
    capped = gate(
        p,
        {
            BF16: searched_record(BF16, Server(itl_slope=0.1, ttft_slope=0.1), bound=128, gpus=8),
            INT4: searched_record(INT4, Server(), gpus=1),
        },
    )
    assert [r.variant for r in capped.per_gpu] == [INT4, BF16] and capped.per_gpu[1].at_least
    assert capped.recommended is None and capped.recommended_note.startswith(f"undecided: {BF16} still met the SLO")
