"""roles/image on the machines: the head's registry outlives a boot that brings the fabric up late."""
import pytest

from sparkfleet.model.image import REGISTRY_DROPIN
from sparkfleet.render import render


def test_the_registry_is_retried_until_the_fabric_address_binds(host, node):
    """After a power cut the fabric address can come up after the registry's unit; without the drop-in
    the packaged unit fails once and the workers have no registry until a deploy."""
    if not node.is_head:
        pytest.skip("the registry is on the head")
    dropin = host.file(REGISTRY_DROPIN)
    want = render("image", REGISTRY_DROPIN, firewall_enabled=node.firewall_enabled)
    assert dropin.exists and dropin.content_string == want, f"{node.name}: {REGISTRY_DROPIN} is not as rendered"
    shown = host.run("systemctl show docker-registry -p Restart -p StartLimitIntervalUSec").stdout.split()
    assert shown == ["Restart=always", "StartLimitIntervalUSec=0"], f"{node.name}: docker-registry has {shown}"
    assert host.service("docker-registry").is_running and host.service("docker-registry").is_enabled
