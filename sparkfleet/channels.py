"""At most CHANNELS_PER_HOST commands and file transfers at once on one host's connection.

pyinfra runs each command (and each file transfer) on an SSH channel of the host's one connection,
and sparkfleet reads facts at once (sparkfleet.once.at_once, per_host, per_group): one host's own
reads, its group's readers and the other nodes' reads of it (a worker reads its head's registry
digest) can overlap there. sshd refuses a channel past MaxSessions on one connection (OpenSSH's
default is 10, sshd_config(5)), and paramiko reports it as ChannelException(2, 'Connect failed'),
which fails the run: in make test of 8560e2f the four-host fleet's deploy stopped so, at prepare,
reading RepoDigests on spark-c. The limits each caller of at_once sets cannot see the others'; this
one is per connection, below sshd's, whoever asks. A call waits for a free channel instead of
failing; none holds one while it waits for another greenlet (a command runs, then returns), so no
wait can close a circle.

A cap on this side is not enough alone: sshd frees a session only once the client's close reaches
it, after the command's exit status came back (pyinfra keeps no channel open, and its SFTP channel
is one more for the connection's life), so under load it can still count more sessions than run
(the fleet's deploy hit the refusal again with 8 at most here, on the lab of a27d3b2). A channel sshd
refused never ran its command, so it is asked again, a moment later (OPEN_RETRIES, backing off); on
the lab with spark-a's MaxSessions set to 3, the fleet's deploy failed at prepare on the refusal without
this and ran with it.
"""
from functools import wraps

# Below OpenSSH's default MaxSessions (10), leaving room for what does not pass through pyinfra's
# Host methods (a connector's own helper channels).
CHANNELS_PER_HOST = 8
# A refused channel asked again this many times, 0.1 s more each time (4.5 s in all), before the
# refusal stands.
OPEN_RETRIES = 9


def refused(err: Exception, host) -> bool:
    """Whether `err` is sshd's refusal of a new channel on a connection that is still up (nothing ran,
    so the call can be made again). paramiko 4.0.0 (Transport.open_channel) raises the refusal it was
    told, ChannelException(2, 'Connect failed'), to the one waiter that reads it (get_exception clears
    it); another greenlet whose open was refused at the same moment gets SSHException('Unable to open
    channel.') instead, the same refusal. That text is also what a dead connection raises: a retry
    then needs the transport still active."""
    from paramiko import ChannelException
    from paramiko.common import OPEN_FAILED_CONNECT_FAILED

    if isinstance(err, ChannelException):
        return err.code == OPEN_FAILED_CONNECT_FAILED
    if str(err) != "Unable to open channel.":
        return False
    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is None or transport.is_active()


def bound(cls, names, limit: int = CHANNELS_PER_HOST) -> None:
    """Wrap each method `names` of `cls` so that at most `limit` calls of them run at once per
    instance; the methods share one count per instance (each holds a channel of its connection). A
    call waits its turn; one whose channel sshd refused is made again (OPEN_RETRIES). Once per class:
    a second call changes nothing."""
    import gevent
    from gevent.lock import BoundedSemaphore
    from paramiko import SSHException

    slots: dict[int, BoundedSemaphore] = {}

    def wrap(method):
        @wraps(method)
        def call(self, *args, **kwargs):
            slot = slots.get(id(self))
            if slot is None:
                slot = slots[id(self)] = BoundedSemaphore(limit)
            for attempt in range(OPEN_RETRIES + 1):
                try:
                    with slot:
                        return method(self, *args, **kwargs)
                except SSHException as err:
                    if not refused(err, self) or attempt == OPEN_RETRIES:
                        raise
                gevent.sleep(0.1 * (attempt + 1))

        call.sparkfleet_bounded = True
        return call

    for name in names:
        if not getattr(getattr(cls, name), "sparkfleet_bounded", False):
            setattr(cls, name, wrap(getattr(cls, name)))


def install(limit: int = CHANNELS_PER_HOST) -> None:
    """Bound pyinfra's Host.run_shell_command, put_file and get_file per host (bound)."""
    from pyinfra.api.host import Host

    bound(Host, ("run_shell_command", "put_file", "get_file"), limit)
