"""Facts of roles/guards: memory outside the engine, and the engine's own use."""
import shlex

from pyinfra.api import FactBase

from sparkfleet.model.guard_rules import parse_size
from sparkfleet.keyvalue import key_values


class ProcessMemory(FactBase):
    """`rss_kib cgroup comm` of every process, largest first (top 40)."""

    def command(self) -> str:
        return "ps -eo rss=,cgroup=,comm= --sort=-rss | head -n 40"

    def process(self, output):
        return list(output)


class ContainerMemory(FactBase):
    """Bytes a running container uses, as `docker stats` counts them (its memory cgroup's usage less
    inactive page cache), or None when it is not running.

    Read from the cgroup itself: `docker stats --no-stream` waits for two samples (~1.5 s a node).
    The container's cgroup is its main process's, from /proc: cgroup v2 (DGX OS, systemd driver:
    system.slice/docker-<id>.scope) or v1's memory controller (cgroupfs driver: /docker/<id>, the
    lab); docker stats answers where neither file is readable.
    """

    def command(self, container: str) -> str:
        c = shlex.quote(container)
        return "\n".join([
            f"pid=$(docker inspect --format '{{{{if .State.Running}}}}{{{{.State.Pid}}}}{{{{end}}}}' {c} 2>/dev/null)",
            'case "$pid" in ""|0) exit 0;; esac',
            'v2=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/$pid/cgroup 2>/dev/null)',
            "v1=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/$pid/cgroup 2>/dev/null)",
            'if [ -r "$v2/memory.current" ]; then'
            ' echo "usage=$(cat "$v2/memory.current")";'
            " echo \"inactive_file=$(awk '$1 == \"inactive_file\" {print $2}' \"$v2/memory.stat\")\";",
            'elif [ -r "$v1/memory.usage_in_bytes" ]; then'
            ' echo "usage=$(cat "$v1/memory.usage_in_bytes")";'
            " echo \"inactive_file=$(awk '$1 == \"total_inactive_file\" {print $2}' \"$v1/memory.stat\")\";",
            f"else echo \"stats=$(docker stats --no-stream --format '{{{{.MemUsage}}}}' {c} 2>/dev/null)\"; fi",
        ])

    def process(self, output):
        return container_bytes(list(output))


def container_bytes(lines: list[str]) -> int | None:
    """ContainerMemory's output -> bytes in use, or None (not running, or nothing readable)."""
    raw = key_values(lines)
    if raw.get("usage", "").isdigit():
        inactive = raw.get("inactive_file", "")
        return int(raw["usage"]) - (int(inactive) if inactive.isdigit() else 0)
    stats = raw.get("stats", "")
    return int(parse_size(stats.split("/")[0])) if "/" in stats else None


class ModelFiles(FactBase):
    """{"config": config.json text or None, "weights_bytes": total *.safetensors size} of a model directory."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (
            f"if [ -f {p}/config.json ]; then echo '---config'; cat {p}/config.json; echo; echo '---end'; fi; "
            f"echo weights_bytes=$(stat -c %s {p}/*.safetensors 2>/dev/null"
            " | awk '{s += $1} END {printf \"%.0f\\n\", s}')"
        )

    def process(self, output):
        lines = list(output)
        config = None
        if "---config" in lines and "---end" in lines:
            config = "\n".join(lines[lines.index("---config") + 1 : lines.index("---end")])
        size = next((l.split("=", 1)[1] for l in lines if l.startswith("weights_bytes=")), "0")
        return {"config": config, "weights_bytes": int(size) if size.isdigit() else 0}
