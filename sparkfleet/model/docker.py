"""Data of roles/docker: the engine every rank runs its container on."""
from pydantic import BaseModel, Field


class DockerData(BaseModel):
    docker_package: str = Field(
        "docker.io", description="package installed when a node has no Docker engine (DGX OS ships one)"
    )
    docker_log_max_size: str = Field("100m", pattern=r"^[0-9]+[kmg]$", description="json-file log rotation: size per "
    "file")
    docker_log_max_file: int = Field(5, ge=1, description="json-file log rotation: files kept per container")
    docker_registry_port: int = Field(
        5000, ge=1, le=65535, description="port of the image registry on the head's fabric address"
    )


def registry_address(cluster) -> str:
    """The image registry on the head's fabric address: images cross the CX7 link, not the LAN."""
    return f"{cluster.head.fabric_ip}:{cluster.head.docker_registry_port}"
