"""Data of roles/host: host settings the serving pair needs, each justified by a reported failure."""
from pydantic import BaseModel, Field

# logind reads drop-ins from here (logind.conf(5)); 90-: after the distribution's own.
LOGIND_DROP_IN = "/etc/systemd/logind.conf.d/90-sparkfleet.conf"


class HostData(BaseModel):
    host_logind_remove_ipc: bool = Field(
        False, description="logind's `RemoveIPC` on every node (`/etc/systemd/logind.conf.d/90-sparkfleet.conf`; "
        "logind.conf(5) defaults to yes): `yes` deletes a user's System V and POSIX IPC (shared memory, semaphores) "
        "when its last session ends, which killed engine workers running as a login user in the field "
        "(eugr/spark-vllm-docker#352, spark-arena/sparkrun#285, vllm-project/vllm#54259); `no` keeps them across SSH "
        "logouts",
    )
