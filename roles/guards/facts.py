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
