"""Other configurations of the fabric netdevs (both halves of the port): netplan files, NetworkManager connections and
systemd-networkd files that someone else wrote for it (NVIDIA's guide has operators write
/etc/netplan/40-cx7.yaml or an nmcli connection). Two configurations of one netdev fight at the next
reboot, so preflight stops on them unless data says to take them over (`fabric_take_over`).
On the ground floor: preflight, the fabric's role and the doctor read the same facts (fabric_others,
once per run).

One fact reads everything raw (files base64-encoded, nmcli's view of every connection); the
matching runs here, on the controller, where the unit tests feed it outputs recorded from hosts.
"""
import base64
import binascii
import fnmatch
import shlex
from dataclasses import dataclass, replace

import yaml
from pyinfra.api import FactBase

from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.fabric import NETPLAN_FILE, RENDERER_UNITS, RENDERERS_SETTLED
from sparkfleet.once import group_slot, per_host

# Where netplan reads YAML (netplan's generate: /run, /etc and /lib, same-named files overriding in
# that order) and where systemd-networkd reads .network files (systemd.network(5): /etc, /run,
# /usr/lib, same-named files overriding in that order; a symlink to /dev/null masks).
NETPLAN_DIRS = ("/run/netplan", "/etc/netplan", "/lib/netplan", "/usr/lib/netplan")
NETWORKD_DIRS = ("/etc/systemd/network", "/run/systemd/network", "/usr/lib/systemd/network", "/lib/systemd/network")
# What netplan generates: from our own file and from the netplan files checked above.
NETPLAN_NM_PREFIX = "/run/NetworkManager/system-connections/netplan-"
NETPLAN_NETWORKD_PREFIX = "/run/systemd/network/10-netplan-"
# Where a take-over puts a file it disables: beside it, under a name neither netplan (*.yaml) nor
# networkd (*.network) reads, so nothing is lost and undoing it is one `mv` (an earlier one there is
# kept as *.~N~: mv/cp --backup=numbered).
DISABLED_SUFFIX = ".sparkfleet-disabled"
ORIGINAL_SUFFIX = ".sparkfleet-orig"
# netplan device types whose stanzas can carry a physical netdev, and those that take it as a member.
NETPLAN_MEMBER_KEYS = {"bonds": "interfaces", "bridges": "interfaces", "vlans": "link", "vrfs": "interfaces"}


@dataclass(frozen=True)
class OtherConfig:
    kind: str  # "netplan" | "NetworkManager" | "networkd"
    where: str  # a file path, or a connection's name and uuid
    detail: str  # what in it binds the netdev
    takeover: str | None  # the shell command that disables it for good, or None
    why_not: str = ""  # why it cannot be taken over automatically
    action: str = ""  # what the take-over does, in words
    netdevs: tuple[str, ...] = ()  # the port's netdevs it configures

    def names(self, node) -> str:
        return "/".join(self.netdevs) or node.fabric_netdev

    def describe(self) -> str:
        return f"{self.kind} {self.where}: {self.detail}"


class FabricConfigs(FactBase):
    """Raw material: the netdev's MAC and kind, the renderers' states, every netplan and networkd file
    (base64), and every NetworkManager connection with what binds it (nmcli's view)."""

    def command(self, netdev: str, twin: str | None = None) -> str:
        n = shlex.quote(netdev)
        netplan = " ".join(f"{d}/*.yaml" for d in NETPLAN_DIRS)
        networkd = " ".join(f"{d}/*.network" for d in NETWORKD_DIRS)
        kind = ("$(ip -d -j link show dev {} 2>/dev/null | python3 -c "
                "'import json,sys; print((json.load(sys.stdin) or [{{}}])[0].get(\"linkinfo\", {{}}).get(\"info_kind\", \"\"))'"
                " 2>/dev/null)")
        devs = [netdev] + ([twin] if twin else [])
        return "\n".join([
            f"echo \"mac=$(cat /sys/class/net/{n}/address 2>/dev/null)\"",
            f"echo \"kind={kind.format(n)}\"",
            # each half of the port: "dev NAME MAC KIND"
            *(f"echo \"dev {shlex.quote(d)} $(cat /sys/class/net/{shlex.quote(d)}/address 2>/dev/null) "
              f"{kind.format(shlex.quote(d))}\"" for d in devs),
            RENDERERS_SETTLED,  # an operator's `netplan apply` just before the deploy leaves NetworkManager starting
            f"for u in {' '.join(RENDERER_UNITS.values())}; do"
            " echo \"unit $u $(systemctl is-active $u 2>/dev/null | head -n1) $(systemctl is-enabled $u 2>/dev/null | head -n1)\"; done",
            f"for f in {netplan}; do [ -f \"$f\" ] || continue; echo \"netplan $f $(base64 -w0 < \"$f\")\"; done",
            f"for f in {networkd}; do [ -e \"$f\" ] || [ -L \"$f\" ] || continue;"
            " if [ \"$(readlink \"$f\")\" = /dev/null ]; then echo \"networkd $f masked\";"
            # only [Match] decides whether a .network file applies to a link
            " else echo \"networkd $f $(sed -n '/^\\[Match\\]/,/^\\[/p' \"$f\" | base64 -w0)\"; fi; done",
            # nmcli only answers while NetworkManager runs; -t escapes ':' in values as '\:'.
            "if command -v nmcli >/dev/null 2>&1 && systemctl is-active -q NetworkManager 2>/dev/null; then"
            " echo \"nmfiles $(nmcli -t -f UUID,FILENAME connection show 2>/dev/null | base64 -w0)\";"
            " nmcli -t -f UUID connection show 2>/dev/null | while read -r u; do"
            " echo \"nm $(nmcli -t -f connection.uuid,connection.id,connection.type,connection.interface-name,"
            "connection.autoconnect,802-3-ethernet.mac-address,GENERAL.DEVICES,GENERAL.STATE"
            " connection show \"$u\" 2>/dev/null | base64 -w0)\";"
            " done;"
            # NetworkManager's own "Wired connection N" defaults (nm-generated): any configured one wins.
            " for f in /run/NetworkManager/system-connections/*.nmconnection; do"
            " grep -qx 'nm-generated=true' \"$f\" 2>/dev/null && echo \"nmgenerated $(printf %s \"$f\" | base64 -w0)\"; done;"
            " fi",
            "true",  # a fact whose command fails prints its whole output: nothing above is an error
        ])

    def process(self, output):
        return parse_fabric_configs(list(output))


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""


def _nmcli_unescape(value: str) -> str:
    """nmcli -t escapes ':' and '\\' in a value."""
    return value.replace("\\:", ":").replace("\\\\", "\\")


def _nmcli_fields(text: str) -> dict[str, str]:
    """nmcli -t -f a,b connection show X -> {a: value}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key, _nmcli_unescape(value))
    return out


def parse_fabric_configs(lines: list[str]) -> dict:
    facts = {"mac": "", "kind": "", "devs": {}, "units": {}, "netplan": {}, "networkd": {}, "nm": {},
             "nm_generated": []}
    files = {}
    for line in lines:
        head, _, rest = line.partition(" ")
        if head == "dev":
            name, mac, kind = (rest.split() + ["", ""])[:3]
            facts["devs"][name] = {"mac": mac.lower(), "kind": kind}
        elif line.startswith("mac="):
            facts["mac"] = line[4:].strip().lower()
        elif line.startswith("kind="):
            facts["kind"] = line[5:].strip()
        elif head == "unit":
            name, *st = rest.split()
            facts["units"][name] = {"active": st[0] if st else "", "enabled": st[1] if len(st) > 1 else ""}
        elif head in ("netplan", "networkd"):
            path, _, data = rest.partition(" ")
            facts[head][path] = None if data == "masked" else _b64(data)
        elif head == "nm":
            fields = _nmcli_fields(_b64(rest))
            if fields.get("connection.uuid"):
                facts["nm"][fields["connection.uuid"]] = fields
        elif head == "nmgenerated":
            facts["nm_generated"].append(_b64(rest))
        elif head == "nmfiles":  # UUID:FILENAME lines (a UUID has no ':'; the file name's are escaped)
            for entry in _b64(rest).splitlines():
                uuid, _, filename = entry.partition(":")
                files[uuid] = _nmcli_unescape(filename)
    for uuid, filename in files.items():
        if uuid in facts["nm"]:
            facts["nm"][uuid]["FILENAME"] = filename
    return facts


def renderer_in_effect(facts: dict) -> str:
    """Which daemon renders the fabric, in words, from the units' states."""
    units = facts.get("units", {})
    active = [u for u in ("NetworkManager", "systemd-networkd") if units.get(u, {}).get("active") == "active"]
    return " and ".join(active) + " active" if active else "no renderer active"


# --- netplan ------------------------------------------------------------------------------------

def _effective(files: dict[str, str | None], dirs: tuple[str, ...]) -> dict[str, str | None]:
    """Same-named files in a higher-priority directory hide the others (netplan, networkd)."""
    seen, out = set(), {}
    for d in dirs:
        for path in sorted(p for p in files if p.rsplit("/", 1)[0] == d):
            name = path.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                out[path] = files[path]
    return out


def _stanza_binds(key: str, stanza, netdev: str, mac: str) -> tuple[bool, bool]:
    """(binds the netdev, binds it and nothing else for sure) for one `ethernets:` stanza."""
    match = stanza.get("match") if isinstance(stanza, dict) else None
    if not isinstance(match, dict):
        return key == netdev, key == netdev
    name, macaddress = match.get("name"), str(match.get("macaddress") or "").lower()
    if name is not None and not fnmatch.fnmatchcase(netdev, str(name)):
        return False, False
    if macaddress and macaddress != mac:
        return False, False
    exact = (name == netdev or (macaddress and macaddress == mac)) and not any(c in str(name or "") for c in "*?[")
    return True, bool(exact)


def _stanza_summary(key: str, stanza) -> str:
    """ethernets.X (addresses a, b; mtu m; dhcp4): what the operator will recognise."""
    stanza = stanza if isinstance(stanza, dict) else {}
    said = []
    if stanza.get("addresses"):
        said.append("addresses " + ", ".join(str(a) for a in stanza["addresses"]))
    if stanza.get("mtu"):
        said.append(f"mtu {stanza['mtu']}")
    said += [k for k in ("dhcp4", "dhcp6") if stanza.get(k) is True]
    return f"ethernets.{key}" + (f" ({'; '.join(said)})" if said else "")


def _port_binds(key: str, stanza, macs: dict[str, str]) -> tuple[bool, bool]:
    """(binds a netdev of the port, binds only netdevs of it for sure) for one `ethernets:` stanza."""
    judged = [_stanza_binds(key, stanza, netdev, mac) for netdev, mac in macs.items()]
    binds = any(b for b, _ in judged)
    return binds, binds and all(exact for b, exact in judged if b)


def netplan_others(files: dict[str, str | None], netdev: str | dict[str, str], mac: str = "") -> list[OtherConfig]:
    """Every netplan file but sparkfleet's that configures `netdev` (or any of {netdev: mac}, the
    port's halves): a file that configures only them is disabled whole, one that also configures
    other netdevs is rewritten without their stanzas."""
    macs = netdev if isinstance(netdev, dict) else {netdev: mac}
    out = []
    ids_for_netdev: set[str] = set()  # stanza ids (netplan's ids are global across files) bound to the netdev
    parsed = {}  # path -> (network, {stanza id: (binds, exact)})
    for path, text in _effective(files, NETPLAN_DIRS).items():
        if path == NETPLAN_FILE or text is None:
            continue
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            out.append(OtherConfig("netplan", path, f"not valid YAML ({str(err).splitlines()[0]}); netplan refuses "
                                   "every file while it is there", None, "fix or remove it by hand"))
            continue
        network = doc.get("network") if isinstance(doc, dict) else None
        if not isinstance(network, dict):
            continue
        ethernets = {str(k): v for k, v in (network.get("ethernets") or {}).items()}
        parsed[path] = (network, ethernets, {k: _port_binds(k, v, macs) for k, v in ethernets.items()})
        ids_for_netdev.update(k for k, (binds, _) in parsed[path][2].items() if binds)
    for path, (network, ethernets, judged) in parsed.items():
        mine = [k for k, (binds, _) in judged.items() if binds]
        others = [k for k, (binds, _) in judged.items() if not binds]
        globbed = [k for k, (binds, exact) in judged.items() if binds and not exact]
        members = []
        for section, member_key in NETPLAN_MEMBER_KEYS.items():
            for key, stanza in (network.get(section) or {}).items():
                refs = stanza.get(member_key) if isinstance(stanza, dict) else None
                refs = refs if isinstance(refs, list) else [refs]
                if any(str(r) in ids_for_netdev or str(r) in macs for r in refs if r is not None):
                    members.append(f"{section}.{key}")
        if not mine and not members:
            continue
        detail = "configures " + ", ".join([_stanza_summary(k, ethernets[k]) for k in mine] + members)
        q = shlex.quote(path)
        if not path.startswith("/etc/netplan/"):
            take, why = None, (f"it is outside /etc/netplan (netplan reads {path.rsplit('/', 1)[0]} first or a package "
                               "owns it); remove the fabric netdev from it by hand")
        elif members:
            take, why = None, "the netdev is a member of a bond, bridge or VLAN there; change that by hand"
        elif globbed:
            take, why = None, (f"its match ({', '.join(globbed)}) may cover other netdevs too; make it name only "
                               "the ones it means, by hand")
        elif not others and all(k in ("version", "renderer", "ethernets") for k in network):
            take, why = f"mv --backup=numbered {q} {shlex.quote(path + DISABLED_SUFFIX)}", ""
            action = f"renamed to {path + DISABLED_SUFFIX}"
        else:
            # Other devices stay configured: the file is rewritten without the netdev's stanzas.
            take, why = (f"cp -p --backup=numbered {q} {shlex.quote(path + ORIGINAL_SUFFIX)} && "
                         f"sfl_netplan_drop={shlex.quote(','.join(mine))} python3 -c {shlex.quote(_DROP_STANZAS)} {q}"), ""
            action = f"rewritten without {', '.join(mine)} (the original kept as {path + ORIGINAL_SUFFIX})"
        bound = tuple(nd for nd, m in macs.items()
                      if any(_stanza_binds(k, ethernets[k], nd, m)[0] for k in mine)
                      or any(nd == k for k in mine))
        out.append(OtherConfig("netplan", path, detail, take, why, action if take else "", bound))
    return out


# Rewrites a netplan file without the named ethernets stanzas (comments are not kept; the original is
# kept beside it as *.sparkfleet-orig). PyYAML is in the hosts' python3 wherever netplan is (netplan's own).
_DROP_STANZAS = """\
import os, sys, yaml
path = sys.argv[1]
drop = set(os.environ["sfl_netplan_drop"].split(","))
doc = yaml.safe_load(open(path))
eth = doc["network"].get("ethernets") or {}
for key in drop:
    eth.pop(key, None)
if not eth:
    doc["network"].pop("ethernets", None)
head = "# sparkfleet (fabric_take_over) removed %s from this file; the original is %s%s\\n" % (
    ", ".join(sorted(drop)), path, ".sparkfleet-orig")
tmp = path + ".sparkfleet-tmp"
with open(tmp, "w") as f:
    f.write(head + yaml.safe_dump(doc, default_flow_style=False, sort_keys=False))
os.chmod(tmp, os.stat(path).st_mode & 0o777)
os.replace(tmp, path)
"""


# --- systemd-networkd ---------------------------------------------------------------------------

def _match_section(text: str) -> dict[str, list[str]]:
    """[Match] of a .network file: key -> values (keys may repeat; an empty assignment resets)."""
    section, out = None, {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        if section != "Match" or "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        if value == "":
            out[key] = []
        else:
            out.setdefault(key, []).extend(value.split())
    return out


def _list_matches(patterns: list[str], value: str, glob=True) -> bool:
    """systemd's match list: any pattern matches; a list starting with '!' is inverted."""
    if not patterns:
        return True
    invert = patterns[0].startswith("!")
    pats = [patterns[0][1:], *patterns[1:]] if invert else patterns
    hit = any(fnmatch.fnmatchcase(value, p) if glob else p.lower() == value for p in pats if p)
    return hit != invert


def networkd_match(match: dict[str, list[str]], netdev: str, mac: str, kind: str) -> tuple[bool, bool]:
    """(matches the netdev, names it and nothing else) for a [Match] section. Keys that cannot be
    judged from here (Driver, Path, Property, Host, ...) are taken as matching: a false alarm that
    names the file is better than a fight at the next reboot."""
    if not _list_matches(match.get("Name", []) + match.get("OriginalName", []), netdev):
        return False, False
    for key in ("MACAddress", "PermanentMACAddress"):
        if not _list_matches([m.lower() for m in match.get(key, [])], mac, glob=False):
            return False, False
    if not _list_matches(match.get("Type", []), "ether"):
        return False, False
    if match.get("Kind") and not _list_matches(match["Kind"], kind or ""):
        return False, False
    if any(match.get(k) for k in ("WLANInterfaceType", "SSID", "BSSID")):
        return False, False  # the fabric is no wireless link
    exact = (match.get("Name") == [netdev] or [m.lower() for m in match.get("MACAddress", [])] == [mac]) \
        and set(match) <= {"Name", "MACAddress", "Type"}
    return True, exact


def networkd_others(files: dict[str, str | None], netdev: str, mac: str, kind: str) -> list[OtherConfig]:
    out = []
    for path, text in _effective(files, NETWORKD_DIRS).items():
        if text is None or path.startswith(NETPLAN_NETWORKD_PREFIX):
            continue  # masked, or netplan's own output (its source is a netplan file, judged above)
        match = _match_section(text)
        matches, exact = networkd_match(match, netdev, mac, kind)
        if not matches:
            continue
        shown = " ".join(f"{k}={' '.join(v)}" for k, v in match.items()) or "no [Match] (every link)"
        name = path.rsplit("/", 1)[1]
        q = shlex.quote(path)
        # networkd reads its files again only when told to (netplan apply does it for its own renderer only).
        reload = " && { ! systemctl is-active -q systemd-networkd || networkctl reload; }"
        action = ""
        if not exact:
            take, why = None, "its [Match] may cover other links too; make it name only the ones it means, by hand"
        elif path.startswith("/etc/systemd/network/"):
            take, why = f"mv --backup=numbered {q} {shlex.quote(path + DISABLED_SUFFIX)}" + reload, ""
            action = f"renamed to {path + DISABLED_SUFFIX}"
        else:  # a same-named link to /dev/null in /etc masks it (systemd.network(5))
            take, why = f"ln -sfn /dev/null {shlex.quote('/etc/systemd/network/' + name)}" + reload, ""
            action = f"masked by /etc/systemd/network/{name} -> /dev/null"
        out.append(OtherConfig("networkd", path, f"matches it ([Match] {shown})", take, why, action))
    return out


# --- NetworkManager ----------------------------------------------------------------------------

def nm_others(connections: dict[str, dict], netdev: str, mac: str, generated=()) -> list[OtherConfig]:
    out = []
    for uuid, c in sorted(connections.items(), key=lambda kv: kv[1].get("connection.id", "")):
        filename = c.get("FILENAME", "")
        if filename.startswith(NETPLAN_NM_PREFIX):
            continue  # netplan's own output (its source is a netplan file, judged above)
        if filename in generated:
            # NetworkManager's own default for a device nothing configures ("Wired connection N",
            # autoconnect-priority -999, in memory): any configured connection wins over it, and
            # none is made at boot once netplan's connection exists.
            continue
        ifname = c.get("connection.interface-name", "")
        cmac = c.get("802-3-ethernet.mac-address", "").lower()
        devices = [d for d in c.get("GENERAL.DEVICES", "").split(",") if d]
        binds = []
        if ifname == netdev:
            binds.append(f"interface-name {netdev}")
        if cmac and cmac == mac:
            binds.append(f"mac-address {cmac}")
        if netdev in devices:
            binds.append(f"active on {netdev}")
        if not binds or (ifname and ifname != netdev and netdev not in devices):
            continue
        autoconnect = c.get("connection.autoconnect", "")
        if autoconnect == "no" and netdev not in devices:
            continue  # already disabled: it never comes up by itself
        name = c.get("connection.id", uuid)
        where = f"connection '{name}' ({uuid}{', ' + filename if filename else ', in memory'})"
        u = shlex.quote(uuid)
        take = (f"nmcli connection modify {u} connection.autoconnect no && "
                f"{{ nmcli connection down {u} >/dev/null 2>&1 || true; }}")
        out.append(OtherConfig("NetworkManager", where, ", ".join(binds) + f", autoconnect {autoconnect or '?'}", take,
                               action="set to autoconnect no (kept) and brought down"))
    return out


def other_configs(facts: dict, netdev: str | tuple[str, ...]) -> list[OtherConfig]:
    """Every configuration of `netdev` (or of each of the port's netdevs) besides sparkfleet's own
    netplan file; one that configures both halves is named once."""
    netdevs = (netdev,) if isinstance(netdev, str) else tuple(netdev)
    devs = facts.get("devs", {})
    macs = {nd: devs.get(nd, {}).get("mac") or (facts.get("mac", "") if i == 0 else "") for i, nd in enumerate(netdevs)}
    kinds = {nd: devs.get(nd, {}).get("kind") or (facts.get("kind", "") if i == 0 else "") for i, nd in enumerate(netdevs)}
    out = netplan_others(facts.get("netplan", {}), macs)
    seen = {(c.kind, c.where) for c in out}
    for nd in netdevs:
        for c in (nm_others(facts.get("nm", {}), nd, macs[nd], facts.get("nm_generated", ()))
                  + networkd_others(facts.get("networkd", {}), nd, macs[nd], kinds[nd])):
            if (c.kind, c.where) in seen:
                i = next(i for i, o in enumerate(out) if (o.kind, o.where) == (c.kind, c.where))
                out[i] = replace(out[i], netdevs=out[i].netdevs + (nd,))
            else:
                seen.add((c.kind, c.where))
                out.append(replace(c, netdevs=(nd,)))
    return out


def renderer_state(node, facts: dict) -> str:
    """The ActiveState of the node's netplan_renderer's service, from FabricConfigs ('' unknown)."""
    return facts.get("units", {}).get(RENDERER_UNITS[node.netplan_renderer], {}).get("active", "")


def netconfig_problems(node, facts: dict, configs: list[OtherConfig]) -> list[str]:
    """What the doctor and the state checks fail on: every other configuration of the fabric netdev,
    and a netplan_renderer whose service is not active."""
    unit = RENDERER_UNITS[node.netplan_renderer]
    problems = [f"{node.name}: {c.names(node)} is also configured by {c.describe()}" for c in configs]
    if renderer_state(node, facts) != "active":
        problems.append(f"{node.name}: netplan_renderer is {node.netplan_renderer}, but {unit} is not active")
    return problems


def conflict_failures(node, configs: list[OtherConfig]) -> list[str]:
    """Preflight failures: each other configuration named, with what to do about it."""
    failures = []
    for c in configs:
        if node.fabric_take_over and c.takeover:
            continue
        if node.fabric_take_over:
            failures.append(f"{node.name}: {c.names(node)} is also configured by {c.describe()}; "
                            f"fabric_take_over cannot disable it: {c.why_not}")
        else:
            fix = (f"set fabric_take_over = true to have the deploy disable it ({c.action})"
                   if c.takeover else c.why_not)
            failures.append(f"{node.name}: {c.names(node)} is also configured by {c.describe()}; two "
                            f"configurations of one netdev fight at the next reboot. Remove it, or {fix}")
    return failures


def fabric_others(state) -> dict[str, tuple[dict, list[OtherConfig]]]:
    """node name -> (raw facts, every other configuration of its fabric netdevs), read at prepare, once
    per run (preflight, the plan's facts pass and step 3 read the same)."""
    with group_slot(state, "fabric-others") as slot:
        if slot.done:
            return slot.value
        cluster = cluster_from_state(state)

        def one(node_host):
            node = cluster.node(node_host.name)
            facts = node_host.get_fact(FabricConfigs, netdev=node.fabric_netdev, twin=node.fabric_twin_netdev)
            return facts, other_configs(facts, tuple(h.netdev for h in node.fabric_halves))

        return slot.fill(per_host(state, one))
