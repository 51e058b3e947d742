"""The chart's command line, run for real: the container command, arguments, environment and mounts that the
chart renders for examples/small-cpu.yaml, started here on the embedded target (a real SGLang server with
dspark's plugin and the admin sidecar, on CPU) until the readiness path answers 200 and the admin port answers
gRPC health, then one request.

Only what cannot exist outside a pod is translated: each mount path becomes a folder of its own (the admin
tokens Secret, which the chart's token Job makes in a cluster, is written there with a token per file the
arguments name), the paths docker/Dockerfile copies into the image
become their source folders in this checkout, and the ports are free ones (set through the chart's own values,
with listenAddress 127.0.0.1)."""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dspark.integration.server import free_port, stop_process_group
from dspark.models.decoding.settings import names

from tests.helm.chart_tools import CHART, find, serve_settings
from tests.paths import REPO
from tests.server_starts import record_server_start

pytestmark = pytest.mark.slow
READY_TIMEOUT_S = 600.0  # a failure bound for loading on a loaded 2-core machine, not a measurement


def image_paths() -> dict[str, Path]:
    """{path in the image: source folder here} from docker/Dockerfile's COPY lines for the embedded models."""
    copies = re.findall(r"^COPY (embedded/\S+) (/\S+)$", (REPO / "docker" / "Dockerfile").read_text(), re.M)
    return {dest: REPO / src for src, dest in copies}


def translate(text: str, paths: dict[str, Path]) -> str:
    for inside in sorted(paths, key=len, reverse=True):  # longest prefix first
        if text == inside or text.startswith(inside + "/"):
            return str(paths[inside]) + text[len(inside):]
    return text


class RenderedServer:
    """The rendered Deployment's serving container as a local process group."""

    def __init__(self, docs: list[dict], folder: Path):
        pod = find(docs, "Deployment")["spec"]["template"]["spec"]
        self.container = next(c for c in pod["containers"] if c["name"] == "dspark")
        paths = dict(image_paths())
        for mount in self.container["volumeMounts"]:
            if mount["mountPath"] != "/dev/shm":  # SGLang's shared memory is the machine's own /dev/shm here
                paths[mount["mountPath"]] = folder / mount["name"]
                paths[mount["mountPath"]].mkdir()
        args = self.container["args"]
        for i, arg in enumerate(args[:-1]):
            if arg in ("--admin-token-file", "--reader-token-file"):
                Path(translate(args[i + 1], paths)).write_text(secrets.token_hex(24))
        self.cache = paths["/var/cache/dspark"]
        assert self.container["command"][0] == "dspark"
        self.command = [str(Path(sys.executable).parent / "dspark"), *self.container["command"][1:],
                        *[translate(arg, paths) for arg in self.container["args"]]]
        self.env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.env.update({e["name"]: translate(e["value"], paths) for e in self.container["env"]})
        self.log = folder / "serve.log"
        record_server_start("dspark serve")
        self.process = subprocess.Popen(self.command, env=self.env, cwd=folder, stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def port(self, name: str) -> int:
        return next(p["containerPort"] for p in self.container["ports"] if p["name"] == name)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port('http')}{path}", timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, b""
        except OSError:  # not listening yet
            return 0, b""

    def wait_for(self, ready) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the rendered server did not come up:\n{self.log.read_text()[-4000:]}")
            time.sleep(2.0)


@pytest.fixture(scope="module")
def server(render, tmp_path_factory):
    ports = {"http.port": free_port(), "admin.port": free_port(), "admin.metricsPort": free_port()}
    docs = render("--values", str(CHART / "examples" / "small-cpu.yaml"), "--set", "listenAddress=127.0.0.1",
                  *[f for key, port in ports.items() for f in ("--set", f"{key}={port}")])
    started = RenderedServer(docs, tmp_path_factory.mktemp("rendered-pod"))
    started.settings = serve_settings(started.container["args"])
    try:
        yield started
    finally:
        stop_process_group(started.process)


def grpc_health(server: RenderedServer) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{server.port('admin')}") as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
        except grpc.RpcError:
            return health_pb2.HealthCheckResponse.UNKNOWN


def test_the_rendered_command_line_serves_until_ready_then_answers_a_request(server):
    readiness = server.container["readinessProbe"]["httpGet"]
    assert readiness["port"] == "http"
    server.wait_for(lambda: server.get(readiness["path"])[0] == 200)
    server.wait_for(lambda: grpc_health(server) == health_pb2.HealthCheckResponse.SERVING)
    for probe in ("startupProbe", "livenessProbe"):
        assert server.get(server.container[probe]["httpGet"]["path"])[0] == 200, probe

    body = json.dumps({"model": "default", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.port('http')}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        completion = json.loads(response.read())
    assert completion["choices"][0]["text"] and completion["usage"]["completion_tokens"] > 0


def test_the_server_starts_with_the_rendered_runtime_state_and_profiles_into_its_cache_volume(server):
    server.wait_for(lambda: server.get("/server_info")[0] == 200)
    state = json.loads(server.get("/server_info")[1])["internal_states"][0]["dspark"]
    expected = {name: server.settings[name] for name in names() if name != "sps_table"}
    assert {name: state[name] for name in expected} == expected
    # no table given: the plugin profiled one at start, into dspark's cache volume (the root is read-only)
    assert Path(state["sps_table"]).is_relative_to(server.cache)
    assert server.settings["policy"] == "fixed" and server.settings["max_verify_length"] == 3
