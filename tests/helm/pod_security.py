"""The Pod Security Standards' "restricted" profile (Kubernetes' documented controls, baseline ones included) as
a check of a rendered pod spec. The test API server is v1.20, which predates the PodSecurity admission plugin
(1.23), so the controls are written out here, each with the field it reads."""
from __future__ import annotations

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
SECCOMP_ALLOWED = {"RuntimeDefault", "Localhost"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range"}


def violations(pod: dict) -> list[str]:
    """What in a pod spec breaks the restricted profile, one line per control and container."""
    out = []
    pod_ctx = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"{field}: true")
    for volume in pod.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {kind}")
    for sysctl in pod_ctx.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl['name']}")
    if pod_ctx.get("runAsUser") == 0:
        out.append("pod runAsUser: 0")
    containers = pod.get("initContainers", []) + pod["containers"] + pod.get("ephemeralContainers", [])
    for container in containers:
        name, ctx = container["name"], container.get("securityContext", {})
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser: 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in SECCOMP_ALLOWED:
            out.append(f"{name}: seccompProfile {seccomp}")
        capabilities = ctx.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            out.append(f"{name}: capabilities do not drop ALL")
        for added in set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capability {added}")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount {ctx['procMount']}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                out.append(f"{name}: hostPort {port['hostPort']}")
    return out
