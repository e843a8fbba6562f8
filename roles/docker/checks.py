"""The Docker daemon configuration sparkfleet writes, and what `docker info` must then say."""
import json

from pyinfra.api import FactBase

from sparkfleet.model.docker import registry_address


def daemon_config(node, cluster) -> dict:
    cfg = {
        "log-driver": "json-file",
        "log-opts": {"max-size": node.docker_log_max_size, "max-file": str(node.docker_log_max_file)},
        # Containers keep running while dockerd restarts for a config change.
        "live-restore": True,
        # Plain HTTP, on the point-to-point fabric only.
        "insecure-registries": [registry_address(cluster)],
    }
    if node.gpu_expected:
        cfg["default-runtime"] = "nvidia"
        cfg["runtimes"] = {"nvidia": {"path": "nvidia-container-runtime", "args": []}}
    return cfg


def docker_info_problems(node, cluster, info: dict | None) -> list[str]:
    """What `docker info` shows that differs from the configuration (empty when all is as written)."""
    if not info:
        return [f"{node.name}: docker info failed (is the engine running?)"]
    problems = []
    if info.get("LoggingDriver") != "json-file":
        problems.append(f"{node.name}: docker logging driver {info.get('LoggingDriver')}, want json-file")
    if info.get("LiveRestoreEnabled") is not True:
        problems.append(f"{node.name}: docker live-restore is off")
    indexes = (info.get("RegistryConfig") or {}).get("IndexConfigs") or {}
    insecure = {c.get("Name") for c in indexes.values() if not c.get("Secure", True)}
    if registry_address(cluster) not in insecure:
        problems.append(f"{node.name}: docker does not list {registry_address(cluster)} as an insecure registry")
    if node.gpu_expected:
        if "nvidia" not in (info.get("Runtimes") or {}):
            problems.append(f"{node.name}: docker has no nvidia runtime (runtimes: {', '.join(info.get('Runtimes') or {})})")
        if info.get("DefaultRuntime") != "nvidia":
            problems.append(f"{node.name}: docker default runtime {info.get('DefaultRuntime')}, want nvidia")
    return problems


class DockerInfo(FactBase):
    def command(self) -> str:
        return "docker info --format '{{json .}}' 2>/dev/null || true"

    def process(self, output):
        text = "\n".join(output).strip()
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return None
