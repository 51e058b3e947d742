"""A real Kubernetes control plane on loopback for the chart's tests: etcd (Debian's etcd-server), and
kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 built from Debian's kubernetes source
package by scripts/setup_k8s_tools.sh. There is no kubelet: `Kubelet` below plays its part for pods that the
scheduler bound (marks them Running and Ready with an address, and finishes deletions), which is all the
Deployment, EndpointSlice and Endpoints controllers look at. Every process listens on 127.0.0.1 and is
stopped by its PID."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path

from dspark.integration.server import free_port

START_TIMEOUT_S = 120.0  # failure bound for the API server to answer /readyz


class ControlPlane:
    def __init__(self, bin_dir: Path, folder: Path):
        self.bin, self.folder = bin_dir, folder
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.kubeconfig = folder / "kubeconfig"
        self.processes: list[subprocess.Popen] = []

    def start(self) -> "ControlPlane":
        f = self.folder
        subprocess.run(["openssl", "genrsa", "-out", str(f / "sa.key"), "2048"], check=True, capture_output=True)
        (f / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        etcd_port, peer_port = free_port(), free_port()
        self.spawn("etcd", ["etcd", "--name", "test", "--data-dir", str(f / "etcd"),
                            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                            "--initial-cluster", f"test=http://127.0.0.1:{peer_port}"])
        self.spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", "--insecure-port=0", f"--cert-dir={f / 'certs'}",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}", f"--token-auth-file={f / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={f / 'sa.key'}", f"--service-account-signing-key-file={f / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/24", "--endpoint-reconciler-type=none"])
        self.write_kubeconfig(self.kubeconfig, self.token)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.kubectl("get", "--raw", "/readyz", check=False).returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise RuntimeError(f"the API server did not start:\n{(f / 'kube-apiserver.log').read_text()[-3000:]}")
            time.sleep(1.0)
        # nodelifecycle would taint our kubelet-less nodes unreachable and evict the pods
        self.spawn("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--controllers=*,-nodelifecycle", f"--service-account-private-key-file={f / 'sa.key'}",
            f"--root-ca-file={f / 'certs' / 'apiserver.crt'}", "--port=0", "--secure-port=0"])
        self.spawn("kube-scheduler", [str(self.bin / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
                                      "--leader-elect=false", "--port=0", "--secure-port=0"])
        return self

    def spawn(self, name: str, command: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("w")
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder))

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
                  "clusters": [{"name": "test", "cluster": {"server": f"https://127.0.0.1:{self.port}",
                                                            "insecure-skip-tls-verify": True}}],
                  "users": [{"name": "test", "user": {"token": token}}],
                  "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test",
                                                            "namespace": namespace}}]}
        path.write_text(json.dumps(config))
        return path

    def env(self) -> dict[str, str]:
        """The environment of a client of this cluster (make, helm, kubectl, dspark)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], check=check,
                              text=True, capture_output=True, input=stdin)

    def apply(self, manifest: dict) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def add_node(self, name: str, labels: dict, taints: list[dict], capacity: dict) -> None:
        """A Node as a kubelet would register it: capacity, Ready, and no taints but ours (the not-ready taint
        that admission adds at creation is what a kubelet's first Ready status clears)."""
        self.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                    "spec": {"taints": taints}})
        status = {"capacity": capacity, "allocatable": capacity,
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}
        self.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                     json.dumps({"status": status}))
        self.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"spec": {"taints": taints or None}}))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Kubelet(threading.Thread):
    """Plays the kubelet for every bound pod: Running and Ready with a pod IP, and deletions finished."""

    def __init__(self, plane: ControlPlane):
        super().__init__(daemon=True)
        self.plane, self.stopped, self.next_ip = plane, threading.Event(), 10

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            self.sync()

    def sync(self) -> None:
        for pod in self.plane.get("pods", "--all-namespaces")["items"]:
            meta, ready = pod["metadata"], pod_ready(pod)
            where = ["-n", meta["namespace"]]
            if meta.get("deletionTimestamp"):
                self.plane.kubectl("delete", "pod", meta["name"], *where, "--grace-period=0", "--force",
                                   "--wait=false", check=False)
            elif pod["spec"].get("nodeName") and not ready:
                ip = f"10.244.0.{self.next_ip}"
                self.next_ip += 1
                conditions = [{"type": t, "status": "True", "lastTransitionTime": now()}
                              for t in ("Initialized", "ContainersReady", "Ready", "PodScheduled")]
                containers = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "started": True,
                               "restartCount": 0, "state": {"running": {"startedAt": now()}}}
                              for c in pod["spec"]["containers"]]
                status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.1",
                          "startTime": now(), "conditions": conditions, "containerStatuses": containers}
                self.plane.kubectl("patch", "pod", meta["name"], *where, "--subresource=status", "--type=merge",
                                   "-p", json.dumps({"status": status}), check=False)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))
