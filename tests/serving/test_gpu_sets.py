"""serve_bench over the host's GPUs (pipeline/serving/gpu_sets.py): the plan of waves of disjoint GPU sets from
fake device ids, CUDA_VISIBLE_DEVICES read as CUDA reads it, each server's environment, and the runner starting real
server processes (a stand-in for `vllm serve` taking its argv, as in test_vllm_server.py) at the same time, each
with its own GPU set and port, none left behind on a failure or a SIGTERM."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.request

import pytest

from pipeline.core.errors import PipelineError
from pipeline.serving import vllm_server
from pipeline.serving.gpu_sets import ConfigRun, Placement, pack, port_offset, run_waves, server_env, visible_gpus
from pipeline.serving.vllm_server import serve

HOST4 = visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def sets(waves) -> list[dict[str, tuple[str, ...]]]:
    return [{p.label: p.gpus for p in wave} for wave in waves]


# ---- which GPUs


def test_visible_gpus_are_cuda_visible_devices_as_written_else_the_devices_torch_counts():
    assert HOST4 == ["0", "1", "2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": " 4, 6 ,"}) == ["4", "6"]  # a subset of a larger host
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8d2e,GPU-11aa"}) == ["GPU-8d2e", "GPU-11aa"]  # UUIDs pass on
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []  # set empty: CUDA sees none
    assert visible_gpus({}, count=lambda: 2) == ["0", "1"]


# ---- the plan


def test_four_single_gpu_configs_run_in_one_wave_on_a_four_gpu_host():
    waves = pack([ConfigRun(n, 1) for n in ("plain", "eagle3", "ngram", "draft_model")], HOST4)
    assert sets(waves) == [{"plain": ("0",), "eagle3": ("1",), "ngram": ("2",), "draft_model": ("3",)}]
    assert waves[0][0].beside == ("eagle3", "ngram", "draft_model") and [p.slot for p in waves[0]] == [0, 1, 2, 3]


def test_tp2_pairs_take_the_aligned_pairs_and_tp4_takes_the_host():
    assert sets(pack([ConfigRun("plain", 2), ConfigRun("eagle3", 2)], HOST4)) == [
        {"plain": ("0", "1"), "eagle3": ("2", "3")}
    ]
    assert sets(pack([ConfigRun("eagle3", 1), ConfigRun("plain", 4)], HOST4)) == [
        {"plain": ("0", "1", "2", "3")},
        {"eagle3": ("0",)},
    ]
    # a TP 2 beside two TP 1s, whatever the order given: the pair stays aligned (NVLink pairs are 0-1 and 2-3)
    assert sets(pack([ConfigRun("a", 1), ConfigRun("b", 2), ConfigRun("c", 1)], HOST4)) == [
        {"a": ("2",), "b": ("0", "1"), "c": ("3",)}
    ]
    # the ids of a host's subset are what the servers get
    assert sets(pack([ConfigRun("a", 2), ConfigRun("b", 1)], ["4", "5", "6", "7"])) == [{"a": ("4", "5"), "b": ("6",)}]


def test_more_configs_than_gpus_run_in_waves_and_off_runs_one_at_a_time():
    runs = [ConfigRun(f"c{i}", 1) for i in range(6)]
    assert [len(w) for w in pack(runs, HOST4)] == [4, 2]
    assert sets(pack(runs, ["0", "1"])) == [
        {"c0": ("0",), "c1": ("1",)},
        {"c2": ("0",), "c3": ("1",)},
        {"c4": ("0",), "c5": ("1",)},
    ]
    # off (or a one-GPU host): every config alone on the first GPUs, beside nothing
    alone = pack([ConfigRun("plain", 2), ConfigRun("eagle3", 1)], HOST4, parallel=False)
    assert sets(alone) == [{"plain": ("0", "1")}, {"eagle3": ("0",)}] and all(not w[0].beside for w in alone)
    assert sets(pack(runs[:2], ["0"])) == [{"c0": ("0",)}, {"c1": ("0",)}]


def test_a_config_needing_more_gpus_than_the_host_is_one_error_line():
    with pytest.raises(
        PipelineError,
        match=r"^serve_bench tiers\.big\.plain: tensor_parallel_size 4 needs more GPUs "
        r"than the 2 here \(CUDA_VISIBLE_DEVICES=0,1\)$",
    ):
        pack([ConfigRun("plain", 1), ConfigRun("tiers.big.plain", 4)], ["0", "1"])


def test_every_plan_places_each_config_once_on_disjoint_aligned_sets_in_as_few_waves_as_gpus_allow():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.choice([1, 2, 4, 8])
        runs = [ConfigRun(f"c{i}", rng.choice([s for s in (1, 2, 4, 8) if s <= n])) for i in range(rng.randint(1, 9))]
        waves = pack(runs, [str(i) for i in range(n)])
        assert sorted(p.label for w in waves for p in w) == sorted(r.label for r in runs)
        need = {r.label: r.tensor_parallel_size for r in runs}
        for wave in waves:
            used = [g for p in wave for g in p.gpus]
            assert len(used) == len(set(used))  # disjoint
            for p in wave:
                assert len(p.gpus) == need[p.label] and int(p.gpus[0]) % need[p.label] == 0  # aligned
                assert list(map(int, p.gpus)) == list(range(int(p.gpus[0]), int(p.gpus[0]) + need[p.label]))
        # sizes that divide each other pack perfectly: no more waves than the GPU-time needs
        assert len(waves) == -(-sum(need.values()) // n)


def test_each_server_gets_its_gpus_and_multicast_off_where_it_spans_several():
    one = server_env(Placement("plain", ("2",)), environ={})
    assert one == {"CUDA_VISIBLE_DEVICES": "2"}
    two = server_env(Placement("eagle3", ("0", "1"), ("plain",), slot=1), environ={})
    assert two == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_NVLS_ENABLE": "0",
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    # a host VLLM_PORT: vLLM counts up from it for its internal ports, so each server at once gets its own range
    assert server_env(Placement("a", ("0",), slot=0), environ={"VLLM_PORT": "29500"}) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert server_env(Placement("b", ("1",), slot=2), environ={"VLLM_PORT": "29500"})["VLLM_PORT"] == "29700"


def test_serve_bench_stages_on_disjoint_gpus_of_one_host_first_try_different_ports():
    """Two serve_bench stages at once on one 4-GPU host (stage groups: GPUs 0,1 and 2,3), each packing its configs:
    every server of both tries its own port first (by slot in the wave both took 8000 and 8001)."""
    runs = [ConfigRun("plain", 1), ConfigRun("draft_model", 1), ConfigRun("eagle3", 1), ConfigRun("ngram", 1)]
    for wave_a, wave_b in zip(pack(runs, ["0", "1"]), pack(runs, ["2", "3"]), strict=True):
        offsets = [port_offset(p) for p in (*wave_a, *wave_b)]
        assert sorted(offsets) == [0, 1, 2, 3]
    # ids that are not indices (UUIDs, MIG instances) keep the slot
    uuids = pack(runs[:2], ["GPU-aa", "GPU-bb"])[0]
    assert [port_offset(p) for p in uuids] == [0, 1]


def test_an_in_process_engine_over_several_gpus_gets_multicast_off_too():
    """evaluate's and distill's vLLM engines run in this process: at TP > 1 the same four settings go into the
    environment their workers inherit; at TP 1 nothing changes."""
    from pipeline.core.multigpu import MULTICAST_OFF, multicast_off

    env = {"NCCL_NVLS_ENABLE": "1"}
    assert multicast_off(1, env) == {} and env == {"NCCL_NVLS_ENABLE": "1"}
    assert multicast_off(2, env) == MULTICAST_OFF and env == MULTICAST_OFF


# ---- the runner, with real server processes

SERVER = r"""
import http.server, json, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "port": port,
        "nvls": os.environ.get("NCCL_NVLS_ENABLE")}
mode = open(args[args.index("--config") + 1]).read().strip()
if mode == "crash":
    print("RuntimeError: CUDA out of memory (boom)"); sys.exit(3)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/work":  # a benchmark level: a second of load (ten for a slow one)
            t0 = time.time(); time.sleep(10.0 if mode == "slow" else 1.0); body = dict(seen, start=t0, end=time.time())
        else:
            body = seen
        data = json.dumps(body).encode()
        self.send_response(200 if self.path in ("/health", "/work") else 404)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_config(tmp_path):
    script = tmp_path / "fake_vllm.py"
    script.write_text(SERVER)
    pids: list[int] = []

    def run_one(placement: Placement, mode: str = "ok", on_ready=None) -> dict:
        """A config's run as serve_bench does it: its own server on its GPU set and port, then its load."""
        config = tmp_path / f"serve-{placement.label}.yaml"
        config.write_text(mode)
        with serve(
            config,
            tmp_path,
            tmp_path / "logs" / f"{placement.label}-server.log",
            20,
            18000 + placement.slot,
            server_env(placement, environ={}),
            command=[sys.executable, str(script)],
        ) as server:
            pids.append(server.proc.pid)
            if on_ready is not None:
                on_ready()
            with urllib.request.urlopen(f"{server.base_url}/work", timeout=10) as r:
                return json.loads(r.read())

    run_one.pids = pids
    return run_one


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_waves_configs_are_served_at_once_each_on_its_own_gpus_and_port(fake_config):
    waves = pack(
        [ConfigRun("plain", 2), ConfigRun("eagle3", 1), ConfigRun("ngram", 1), ConfigRun("schedule", 4)], HOST4
    )
    seen = run_waves(waves, fake_config)
    # wave 1: the TP 4 config alone; wave 2: the other three at once
    assert {k: v["cuda_visible_devices"] for k, v in seen.items()} == {
        "schedule": "0,1,2,3",
        "plain": "0,1",
        "eagle3": "2",
        "ngram": "3",
    }
    assert seen["plain"]["nvls"] == "0" and seen["eagle3"]["nvls"] is None
    together = [seen[k] for k in ("plain", "eagle3", "ngram")]
    assert len({s["port"] for s in together}) == 3
    assert max(s["start"] for s in together) < min(s["end"] for s in together)  # their loads overlapped in time
    assert seen["schedule"]["end"] <= min(s["start"] for s in together)  # the next wave waited for the last
    assert all(gone(pid) for pid in fake_config.pids)


def test_a_failed_config_fails_the_wave_once_the_others_have_finished(fake_config):
    finished = []

    def one(placement):
        result = fake_config(placement, mode="crash" if placement.label == "eagle3" else "ok")
        finished.append(placement.label)
        return result

    with pytest.raises(PipelineError, match="vllm serve exited with status 3 before it was ready"):
        run_waves(pack([ConfigRun("plain", 1), ConfigRun("eagle3", 1)], HOST4), one)
    assert finished == ["plain"] and all(gone(pid) for pid in fake_config.pids)


def test_sigterm_while_a_wave_runs_stops_every_server_it_started(fake_config):
    """`dvc repro` cancelled: the signal reaches the main thread only; the servers the wave's threads started are
    in their own sessions and would keep holding their GPUs through their ten-second loads."""
    ready = threading.Barrier(2, action=lambda: threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start())
    before = signal.getsignal(signal.SIGTERM)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_waves(
            pack([ConfigRun("plain", 1), ConfigRun("eagle3", 1)], HOST4),
            lambda placement: fake_config(placement, mode="slow", on_ready=ready.wait),
        )
    assert time.monotonic() - t0 < 9  # the loads were cut short, not waited for
    assert signal.getsignal(signal.SIGTERM) is before
    assert len(fake_config.pids) == 2 and all(gone(pid) for pid in fake_config.pids)
    assert not vllm_server._live


def test_a_config_not_started_when_the_wave_is_interrupted_never_starts(fake_config):
    """A wave's thread that reaches its server's start after the interrupt's stop_all (it was still preparing, or
    between picking a port and registering the process) would run a whole startup and sweep after the stage was
    cancelled, holding its GPUs: it is refused, and the next run may start servers again."""
    late = Placement("late", ("1",))
    vllm_server.stop_all()
    with pytest.raises(PipelineError, match="not started, the run was interrupted"):
        fake_config(late)
    assert fake_config.pids == []
    assert run_waves([[late]], fake_config)["late"]["cuda_visible_devices"] == "1"  # a new run starts again


def test_waves_of_one_run_on_this_thread():
    threads = run_waves(pack([ConfigRun(c, 1) for c in "ab"], ["0"]), lambda p: threading.current_thread())
    assert set(threads.values()) == {threading.main_thread()}
    both = threading.Barrier(2, timeout=10)  # broken (an error) unless the two run at the same time
    ids = run_waves(pack([ConfigRun(c, 1) for c in "ab"], ["0", "1"]), lambda p: (both.wait(), threading.get_ident()))
    assert threading.get_ident() not in {i for _, i in ids.values()} and len({i for _, i in ids.values()}) == 2


# ---- serve_bench's configs: each at the GPUs its own engine arguments shard over


def test_serve_bench_places_each_config_at_the_tensor_parallelism_its_serve_yaml_has(tmp_path, monkeypatch):
    """The GPUs a config needs come from the engine arguments its serve.yaml renders (serving's, a tier's own
    override), not from one global setting; configs of one call share a wave where the host has the GPUs."""
    from pipeline.drafts import methods
    from pipeline.drafts.settings import DraftParams
    from pipeline.params.load import parse_section
    from pipeline.quantize.recipes import variant_spec
    from pipeline.quantize.settings import QuantizeParams
    from pipeline.serving import sweep as stage
    from pipeline.serving.settings import ServeBenchParams, ServingParams
    from pipeline.serving.tiers import Tier
    from tiny_project import tiny_params

    p = tiny_params(serving={"tensor_parallel_size": 2})
    run = stage.Settings(
        bench=parse_section(p, ServeBenchParams),
        serving=parse_section(p, ServingParams),
        draft=parse_section(p, DraftParams),
        temperature=0.0,
        spec=variant_spec(parse_section(p, QuantizeParams).variants, "bf16"),
    )

    def batch(gpus, parallel=True):
        return stage.Batch(tmp_path, tmp_path, "bf16", None, None, run, None, gpus, parallel)

    monkeypatch.setattr(stage, "serve_config", lambda b, job, placement: (placement.gpus, placement.beside))
    one = Tier("one", engine={"tensor_parallel_size": 1}, gpus=1, tensor_parallel_size=1)
    jobs = [
        stage.Job("plain", methods.NONE, {}, {}),
        stage.Job("ngram", methods.Speculation("ngram", 3), {}, {}),
        stage.Job("plain", methods.NONE, {}, {}, tier=one),
    ]
    assert [batch(["0"]).tensor_parallel_size(j) for j in jobs] == [2, 2, 1]
    assert batch(["0", "1", "2", "3", "4", "5"]).serve(jobs) == {
        "plain": (("0", "1"), ("ngram", "one.plain")),
        "ngram": (("2", "3"), ("plain", "one.plain")),
        "one.plain": (("4",), ("plain", "ngram")),
    }
    assert batch(["0", "1", "2", "3"], parallel=False).serve(jobs) == {
        "plain": (("0", "1"), ()),
        "ngram": (("0", "1"), ()),
        "one.plain": (("0",), ()),
    }
    # the results in the order asked for (the record's), though larger TP sizes are placed first
    assert list(batch(["0", "1"]).serve(jobs[::-1])) == ["one.plain", "ngram", "plain"]


def test_parallel_check_compares_each_config_beside_others_with_it_alone(tmp_path):
    """benchmarks/gpu/parallel_check.py on two records of one variant (serve_bench.parallel off, then auto)."""
    import subprocess

    from latency_model import H100_RUN, Server, swept
    from pipeline.core import records
    from pipeline.serving.bench_record import ServeBenchRecord, ServeConfigResult
    from tiny_project import ROOT

    def record(path, plain_speed, ngram_speed, beside):
        configs = {
            name: ServeConfigResult(0, 60.0, swept(Server(speed=speed)), gpus=[gpu], beside=beside(name))
            for name, speed, gpu in (("plain", plain_speed, "0"), ("ngram", ngram_speed, "1"))
        }
        records.write(path, ServeBenchRecord("bf16", **H100_RUN, configs=configs))
        return str(path)

    alone = record(tmp_path / "alone.json", 100.0, 120.0, lambda name: [])
    near = record(tmp_path / "near.json", 98.0, 121.0, lambda name: ["ngram" if name == "plain" else "plain"])
    slow = record(tmp_path / "slow.json", 90.0, 120.0, lambda name: ["ngram" if name == "plain" else "plain"])
    script = [sys.executable, str(ROOT / "benchmarks/gpu/parallel_check.py")]
    ok = subprocess.run([*script, alone, near], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "| plain | 1 | 100 | 98 | 0.980 | 0 | ngram |" in ok.stdout
    assert re.search(r"\nlargest difference: plain at c=\d+, x0\.980 \(within 5%\)\n$", ok.stdout)
    bad = subprocess.run([*script, alone, slow], capture_output=True, text=True)
    assert bad.returncode == 1 and "x0.900 (outside 5%)" in bad.stdout
