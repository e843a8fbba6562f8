"""sparkfleet: take a pair (or a fleet of serving groups) of DGX Sparks to a state proven to serve.
Run: pyinfra inventory.py deploy.py

The cluster data was validated before any connection (sparkfleet.run, from config.py); each role
below reads the same validated model. A refusal at prepare prints one block and stops the run.
"""
from pyinfra import host, local, state

from roles.rolling.checks import takes_turn, turn_order
from sparkfleet.run import refusals_stop_the_run
from tools.plan import decide, read_facts

with refusals_stop_the_run():
    # 0. One run at a time: the deploy lock on every node, before any fact is read; a live holder
    #    is named and refused, a dead one's lock taken over (roles/lock).
    local.include("roles/lock/tasks.py")

    # 1. Every fact the plan reads, in one pass (tools/plan.py read_facts: each role's reader at once,
    #    preflight's among them); then every node's facts in one table, and hard requirements stop the
    #    deploy before any change.
    read_facts(state)
    local.include("roles/preflight/tasks.py")

    # 1b. The plan, per serving group: every role's verdict taken once from the facts read so far
    #     (what is fetched, built, shipped, warmed and restarted, and why), printed once as a table
    #     before anything runs; and the fleet's: the turn order, the router's routing (what is routed
    #     again, drained for a restart; a drain of a model's last routed group refused here) and where
    #     the fleet's API key is written. Every step below executes its slice (sparkfleet/decided.py).
    decide(state)

    # 2. The field report's failure modes, checked before anything changes: memory admission and
    #    headroom, refused settings, the drafter license.
    local.include("roles/guards/tasks.py")

    # 2a. The fleet fingerprint: kernel, GPU driver, CX7 firmware and Docker the same on every node.
    local.include("roles/fingerprint/tasks.py")

    # 2b. Host settings a pair needs to stay up (logind's RemoveIPC), each a file, applied on change.
    local.include("roles/host/tasks.py")
    # 2c. Docker: the engine, the NVIDIA runtime on GPU nodes, log rotation; restarted only on change.
    #     Before the fabric: the build needs Docker and nothing of steps 3 to 4b.
    local.include("roles/docker/tasks.py")
    # 2d. The recipe checked out at its pinned commit on the head, its launch defaults checked against
    #     the served commit, and the overlay image's build started in the background: the fabric, the
    #     firewall, their proofs and the file path run while it builds; step 5 waits for it.
    local.include("roles/image/build_start_tasks.py")

    # 3. The CX7 fabric: netplan drop-in, applied on change, jumbo frames proven between all nodes.
    local.include("roles/fabric/tasks.py")

    # 3a. HAProxy on each head (the API proxy's program, step 7b2), and the user Prometheus runs as on
    #     the monitoring node (step 4c installs it): the firewall names both users.
    local.include("roles/api_proxy/install_tasks.py")
    local.include("roles/monitoring/user_tasks.py")

    # 3b. The firewall: the API from allowed networks, the fabric's services from the fabric only.
    local.include("roles/firewall/tasks.py")

    # 3c. Jumbo frames proven between every two nodes of a group, through the firewall.
    local.include("roles/fabric/proof_tasks.py")

    # 3d. The fabric's speed, per link (ib_write_bw over both HCAs; iperf3 per half without RDMA),
    #     against its bar in data, when no passed proof of this fabric is on record (roles/fabric_speed).
    local.include("roles/fabric_speed/link_tasks.py")

    # 4a. The fabric's file path: a read-only rsync daemon and HTTP server of the weights per node, and
    #     the fetch/pull/manifest tool (roles/fanout).
    local.include("roles/fanout/tasks.py")

    # 4b. The head's weights fetch, started in the background when it needs no image (a URL or a
    #     directory, or the image already on the head): it runs while the image builds and ships;
    #     each worker's pull follows it in the background, taking each file as it lands.
    local.include("roles/weights/fetch_start_tasks.py")

    # 4c. The monitoring packages (monitoring_enabled), while the head builds and fetches: their services
    #     held from starting until step 12b has written their files.
    local.include("roles/monitoring/install_tasks.py")

    # 5. The recipe's overlay image: its build (started at step 2d) waited for on the head; a fetch from
    #    the hub (its client runs in the image) started in the background right after; then pushed to the
    #    head's fabric registry, and every worker's pull started in the background: it runs while steps
    #    7 to 7b2 do.
    local.include("roles/image/tasks.py")
    local.include("roles/weights/hub_fetch_start_tasks.py")
    local.include("roles/image/ship_tasks.py")

    # 7. Weights: the head's fetch waited for, then pulled by every worker over the fabric, proven by manifests.
    local.include("roles/weights/tasks.py")

    # 7a. The engine in the image judges: before anything stops the pair, the image's own engine (with
    #     the weights mounted as the units mount them) parses every distinct rank's command line and
    #     environment and names its version (roles/engine_proof).
    local.include("roles/engine_proof/tasks.py")

    # 7b. The API key (root-only files), before the prewarm starts the first engine: with a router,
    #     one key for every routed group and the router (the router group's head's), then each head's.
    local.include("roles/router/key_tasks.py")
    local.include("roles/serving/api_key_tasks.py")

    # 7b1. TLS (roles/tls): the fleet's private CA made once on its node, one server certificate per node
    #      with a listener on the LAN (the heads, the router node; with monitoring, every node) issued (and
    #      issued again before it expires), the exporters' copy of it, every such node's trust bundle; on the
    #      router node the router hop's own client certificate (smg's, never copied).
    local.include("roles/tls/tasks.py")

    # 7b2. The API proxy on each head: TLS with the head's certificate, the key on every path but
    #      /health, the engine on loopback behind it (neither engine's own check covers every route).
    local.include("roles/api_proxy/tasks.py")

    # 7d. Every worker's pull of the image waited for, then the same image ID proven on every node.
    local.include("roles/image/pull_wait_tasks.py")

    # 7e. The collective the engine runs (all_gather, in the serving image on every rank, its buffer
    #     from the memory budget) against its bar; the passed proof recorded on every node (roles/fabric_speed).
    local.include("roles/fabric_speed/collective_tasks.py")

    # 7c-11, one serving group after the other (roles/rolling): out of the router, the watchdog
    #     paused, kernel caches warmed, units restarted workers first, the watchdog back, the receipt;
    #     then a real request proves the group serves and it is routed again before the next starts.
    #     First, routing converges: a serving group an earlier run left drained is routed again
    #     (the plan's turns, drains and groups routed again: step 1b).
    local.include("roles/rolling/routing_tasks.py")
    for turn in host.loop(turn_order(state)):
        in_turn = {"sparkfleet_turn": turn}  # 'g1', or 'g1+g2' when none serves yet
        # The turn starts after the groups before it came back (every host defines this barrier);
        # the group out of the router when it restarts.
        local.include("roles/rolling/turn_start.py", data=in_turn)
        if takes_turn(state, turn):  # the hosts of the turn's group define its steps
            # 7c. The watchdog paused (head first) when the prewarm or the group's restart will stop units.
            local.include("roles/watchdog/pause_tasks.py")
            # 8. Kernel caches per image: warmed before production, the union on every rank, manifests equal.
            local.include("roles/kernel_cache/tasks.py")
            # 9. The units: --headless workers first, then the head; /health awaited, endpoint printed.
            local.include("roles/serving/tasks.py")
            # 10. The watchdog: installed, configured, started again where paused or stopped (workers first).
            local.include("roles/watchdog/tasks.py")
            # 11. The benchmark receipt, when the group (re)started: a short fixed load through the API.
            local.include("roles/receipt/tasks.py")
            # A real request proves the group serves; it is routed again before the next turn starts.
            local.include("roles/rolling/turn_end.py")
    local.include("roles/rolling/done.py")

    # 12. The router (router_node): one endpoint for every group serving the same model, smg on loopback
    #     behind its gate (HAProxy over TLS, the API key); groups whose health check fails are taken out
    #     of routing until they pass again.
    local.include("roles/router/tasks.py")

    # 12b. Monitoring (monitoring_enabled; its packages installed at step 4c): the OS's node exporter on every node, the engine's /metrics
    #     through each head's proxy, both over TLS with the node's certificate, the OS's Prometheus
    #     (scraping https) with sparkfleet's alerts on monitoring_node,
    #     and its Alertmanager when data names receivers (monitoring_alertmanager_enabled).
    local.include("roles/monitoring/tasks.py")

    # 13. Run as a plan (`sparkfleet plan`: prepare only, nothing runs), what each operation above
    #     would do on this host, for the plan to print; in a deploy, nothing.
    local.include("roles/plan/operations_tasks.py")
