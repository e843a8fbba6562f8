"""Facts of roles/guards: memory outside the engine, and the engine's own use."""
import shlex

from pyinfra.api import FactBase


class ProcessMemory(FactBase):
    """`rss_kib cgroup comm` of every process, largest first (top 40)."""

    def command(self) -> str:
        return "ps -eo rss=,cgroup=,comm= --sort=-rss | head -n 40"

    def process(self, output):
        return list(output)


class ContainerMemory(FactBase):
    """docker's MemUsage of a container ('19.5MiB / 23.5GiB'), or None when it is not running."""

    def command(self, container: str) -> str:
        return f"docker stats --no-stream --format '{{{{.MemUsage}}}}' {shlex.quote(container)} 2>/dev/null || true"

    def process(self, output):
        text = "".join(output).strip()
        return text.split("/")[0].strip() if "/" in text else None
