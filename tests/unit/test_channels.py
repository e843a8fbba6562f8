"""sparkfleet/channels.py: no more calls at once per host than a connection's channels allow,
whoever makes them, and no limit across hosts."""
import gevent

from sparkfleet import channels


class Conn:
    """A host whose commands and transfers each take a channel for a moment (gevent.sleep)."""
    open_now: dict[str, int] = {}
    most: dict[str, int] = {}

    def __init__(self, name):
        self.name = name

    def _hold(self):
        n = Conn.open_now[self.name] = Conn.open_now.get(self.name, 0) + 1
        Conn.most[self.name] = max(Conn.most.get(self.name, 0), n)
        gevent.sleep(0.01)
        Conn.open_now[self.name] -= 1
        return self.name

    def run_shell_command(self, command):
        return self._hold()

    def put_file(self, src, dest):
        return self._hold()

    def get_file(self, src, dest):
        return self._hold()


def test_at_most_the_limit_of_calls_at_once_per_host_and_the_hosts_apart():
    channels.bound(Conn, ("run_shell_command", "put_file", "get_file"), limit=3)
    channels.bound(Conn, ("run_shell_command",), limit=1)  # a second install changes nothing
    a, b = Conn("a"), Conn("b")
    calls = [gevent.spawn(a.run_shell_command, "x") for _ in range(10)]
    calls += [gevent.spawn(a.put_file, "s", "d") for _ in range(5)] + [gevent.spawn(a.get_file, "s", "d") for _ in range(5)]
    calls += [gevent.spawn(b.run_shell_command, "x") for _ in range(10)]
    gevent.joinall(calls, raise_error=True)
    assert [c.value for c in calls] == ["a"] * 20 + ["b"] * 10  # every call ran, none failed
    assert Conn.most == {"a": 3, "b": 3}  # the three methods share the count; b had its own


def test_pyinfras_host_methods_are_bounded_once_installed():
    from pyinfra.api.host import Host

    channels.install()
    for name in ("run_shell_command", "put_file", "get_file"):
        assert getattr(getattr(Host, name), "sparkfleet_bounded", False), name


class Refusing:
    """A host whose sshd refuses the first channels (MaxSessions, as paramiko reports it), then takes them."""

    def __init__(self, refusals, code=2):
        self.refusals, self.code, self.ran = refusals, code, 0

    def run_shell_command(self, command):
        from paramiko import ChannelException

        if self.refusals:
            self.refusals -= 1
            raise ChannelException(self.code, "Connect failed")
        self.ran += 1
        return True, command


def test_a_refused_channel_is_asked_again_and_a_lasting_refusal_or_another_error_stands():
    import pytest
    from paramiko import ChannelException

    channels.bound(Refusing, ("run_shell_command",), limit=2)
    host = Refusing(refusals=3)
    assert host.run_shell_command("true") == (True, "true") and host.ran == 1  # the command ran once
    lasting = Refusing(refusals=channels.OPEN_RETRIES + 1)
    with pytest.raises(ChannelException):
        lasting.run_shell_command("true")
    assert lasting.ran == 0
    other = Refusing(refusals=1, code=1)  # administratively prohibited: not a full connection
    with pytest.raises(ChannelException):
        other.run_shell_command("true")


def test_the_refusal_paramiko_hands_a_second_waiter_is_a_refusal_too_unless_the_connection_is_gone():
    from paramiko import ChannelException, SSHException

    class Transport:
        def __init__(self, active):
            self.active = active

        def is_active(self):
            return self.active

    class Host:
        def __init__(self, active):
            self.connector = type("C", (), {"client": type("Cl", (), {"get_transport": lambda s: Transport(active)})()})()

    assert channels.refused(ChannelException(2, "Connect failed"), Host(True))
    assert channels.refused(SSHException("Unable to open channel."), Host(True))
    assert not channels.refused(SSHException("Unable to open channel."), Host(False))  # the connection died
    assert not channels.refused(SSHException("Timeout opening channel."), Host(True))
    assert not channels.refused(ChannelException(1, "Administratively prohibited"), Host(True))
