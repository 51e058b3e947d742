"""The 2-node LeaderWorkerSet example, run: the leader's and the worker's `dspark serve` commands, as the chart
renders them, started on this machine as two real processes with LWS's environment for one host (leader address
127.0.0.1), one TP rank each (TP 2 over --nnodes 2, the CPU recipe).

SGLang 0.5.23's CPU path cannot serve TP > 1, on one node or two: after the rendezvous, every tensor-parallel
group of more than one rank builds a PyNcclCommunicator (sglang/srt/distributed/parallel_state.py, GroupCoordinator
.__init__, line 464: use_pynccl is false only on NPU, XPU and the mooncake backend); the NCCL library loads (torch's
nvidia-nccl-cu13, scripts/constraints-cpu.txt), so the communicator is not disabled, and it enters
`torch.cuda.device("cpu")` (device_communicators/pynccl.py line 116), which raises. This test runs the rendered
commands that far and asserts exactly that: both ranks join the torch.distributed world at the leader's
--dist-init-addr and exchange the NCCL id over the gloo group (pynccl.py's dist.broadcast, before line 116: the
worker only gets past it with the leader's bytes), then both stop at that line, and `dspark serve` on each node
exits without starting SGLang again. Should SGLang's CPU path start serving multi-node (or fail elsewhere), this
test fails; it should then send greedy /generate requests to the leader and compare them with
tests/integration/dspark_serve.target_greedy_answers."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dspark.integration.server import free_port, stop_process_group
from tests.helm.chart_tools import LWS_EXAMPLE, LWS_FLAGS
from tests.helm.test_lws import templates
from tests.paths import EMBEDDED, EMBEDDED_TARGET
from tests.server_starts import record_server_start

pytestmark = pytest.mark.slow

ROLES = ("leader", "worker")  # LWS_WORKER_INDEX 0 and 1, SGLang's --node-rank
TP_SIZE = "2"  # one rank per process, what two cores hold
# SGLang's CPU path binds each rank's OpenMP threads to a NUMA node of its own unless told which cores (numa_utils.py,
# init_threads_binding); this machine has one node, so each process gets a core (both ranks are local rank 0)
CPU_CORES = {"leader": "0", "worker": "1"}
OUTCOME_TIMEOUT_S = 480.0  # start-up of two SGLang processes on two busy cores
# where SGLang 0.5.23's CPU path stops, in the traceback of each rank's scheduler
STOPPING_POINT = [
    'sglang/srt/distributed/parallel_state.py", line 464, in __init__\n    self.pynccl_comm = PyNcclCommunicator(',
    'sglang/srt/distributed/device_communicators/pynccl.py", line 116, in __init__\n'
    '    with torch.cuda.device(device):',
    "ValueError: Expected a cuda device, but got: cpu",
]
NOT_RESTARTED = "before its first start-up finished (GET /ready never answered 200); not starting it again"


def lws_environment(index: int) -> dict[str, str]:
    """What the LWS controller sets in a group's pods, for a group on one machine."""
    return {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(index)}


def local_command(container: dict, index: int, http_port: int, dist_port: int, tokens: Path) -> list[str]:
    """The rendered container's command and args, for this machine: the embedded models, CPU, TP 2, free ports,
    127.0.0.1, the test's token files; LWS's $(VAR)s expanded as the kubelet expands them."""
    assert container["command"][0] == "dspark"
    args = list(container["args"])
    local = {"--target": str(EMBEDDED_TARGET), "--drafter": str(EMBEDDED / "dspark"), "--device": "cpu",
             "--host": "127.0.0.1", "--port": str(http_port), "--admin-host": "127.0.0.1",
             "--admin-port": str(free_port()), "--admin-metrics-port": str(free_port()),
             "--admin-token-file": str(tokens / "ops"), "--reader-token-file": str(tokens / "reader")}
    separator = args.index("--")
    for flag, value in local.items():
        if flag in args[:separator]:
            args[args.index(flag) + 1] = value
    tail = args[separator + 1:]
    tail[tail.index("--tp-size") + 1] = TP_SIZE
    address = tail.index("--dist-init-addr") + 1
    assert tail[address] == "$(LWS_LEADER_ADDRESS):5000"  # the example's lws.distPort
    tail[address] = f"$(LWS_LEADER_ADDRESS):{dist_port}"
    for name, value in lws_environment(index).items():
        tail = [arg.replace(f"$({name})", value) for arg in tail]
    return [sys.executable, "-m", "dspark.ops.cli", *container["command"][1:], *args[:separator], "--", *tail]


def leader_ready(url: str) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
            return response.status == 200
    return False


def stop(process: subprocess.Popen) -> None:
    stop_process_group(process)
    # `dspark serve` gone, a scheduler of its SGLang may still hold the group (a rank waiting on its peer)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def test_the_two_node_example_rendezvouses_on_cpu_and_stops_where_sglang_needs_cuda(render, tmp_path):
    pods = templates(render("--values", str(LWS_EXAMPLE), *LWS_FLAGS))
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for name in ("ops", "reader"):
        (tokens / name).write_text(f"{name}-token-of-the-rendezvous-test\n")
    http_port, dist_port = free_port(), free_port()
    url = f"http://127.0.0.1:{http_port}"
    processes, logs = {}, {}
    try:
        for index, role in enumerate(ROLES):
            container = pods[role]["spec"]["containers"][0]
            command = local_command(container, index, http_port if index == 0 else free_port(), dist_port, tokens)
            rendered_env = {e["name"]: e["value"] for e in container.get("env", [])
                            if "value" in e and e["name"] not in ("HOME", "DSPARK_CACHE")}  # the pod's paths
            env = {**os.environ, **rendered_env, **lws_environment(index),
                   "DSPARK_CACHE": str(tmp_path / role / "cache"), "SGLANG_CPU_OMP_THREADS_BIND": CPU_CORES[role]}
            env.pop("TRITON_INTERPRET", None)
            (tmp_path / role).mkdir()
            logs[role] = tmp_path / role / "serve.log"
            record_server_start("dspark serve")
            processes[role] = subprocess.Popen(command, env=env, cwd=tmp_path / role, stdout=logs[role].open("w"),
                                               stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + OUTCOME_TIMEOUT_S
        ready = False
        while not ready and time.monotonic() < deadline and None in [p.poll() for p in processes.values()]:
            ready = leader_ready(url)
            time.sleep(2)
        texts = {role: path.read_text(errors="replace") for role, path in logs.items()}
        assert not ready, "SGLang's CPU path now serves multi-node: compare the leader's answers with the target's"
        for index, role in enumerate(ROLES):
            text = texts[role]
            # the process held TP rank `index` of a world of 2 and joined it through the leader's address
            assert f"TP{index}] Init parallel begin." in text, text[-3000:]
            assert f"'dist_init_addr': '127.0.0.1:{dist_port}'," in text
            assert f"'nnodes': 2, 'node_rank': {index}, 'tp_size': 2," in text
            for line in STOPPING_POINT:
                assert line in text, f"the {role} stopped elsewhere:\n{text[-3000:]}"
            assert NOT_RESTARTED in text
            assert processes[role].poll() not in (None, 0), f"the {role} is still running or exited 0"
        assert "TP0] sglang is using nccl==" in texts["leader"]  # the library loaded: the communicator is not off
    finally:
        for process in processes.values():
            stop(process)
