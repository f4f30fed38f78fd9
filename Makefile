# Two commands on a fresh Debian machine (as root): `make test` and `make demo`.
# Both run `make setup` first, which is idempotent and takes seconds once done.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Debian packages the tests and the demo run for real: ZooKeeper (Java) and Redis;
# Chromium for the dashboard's browser test; docker-compose to validate the compose file;
# iproute2 and iptables for the network partitions (namespaces, veth, DROP rules);
# redis-sentinel for the Redis failover tests and `discovery devcluster --sentinels`;
# prometheus for promtool, which checks and unit-tests the alert rules (deploy/alerts.yml).
DEB_PACKAGES := zookeeper redis-server redis-sentinel default-jre-headless chromium \
  docker-compose iproute2 iptables prometheus
STAMP  := $(VENV)/.installed

.PHONY: setup system-packages test test-fast lint typecheck docs pytest demo devcluster bench chaos chaos-ci soak \
  docker-engine image compose-secrets compose-check clean

setup: system-packages $(STAMP)

system-packages:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Reinstall only when the project's metadata changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy discovery data_server search_server examples

# The suite runs on PYTEST_WORKERS parallel workers (pytest-xdist), each with a ZooKeeper
# and a Redis of its own for the session: most tests wait on servers and timeouts, not
# on a CPU, so three workers beat two on a 2-core machine (four were faster still but
# load timing-sensitive tests harder). `worksteal` lets an idle worker take queued tests
# from a busy one, so a long test (the demo) does not leave the others waiting at the
# end. PYTEST_WORKERS=0 runs in this process, as plain pytest does. Either way the 20
# slowest tests are listed at the end.
PYTEST_WORKERS ?= 3
PYTEST_ARGS    ?=
PYTEST := $(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=20 $(PYTEST_ARGS)

pytest: setup
	$(PYTEST)

# The documentation site (mkdocs.yml) into DOCS_SITE: strict, so a broken link, anchor or
# docstring reference, a missing example or a failing `--help` is an error; offline (no
# fonts, inventories or downloads). tests/integration/test_docs.py builds its own copy and opens the
# API reference in Chromium.
DOCS_SITE ?= site
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

test: lint typecheck docs pytest

# The tests that need no ZooKeeper, Redis, network namespace, server process, Chromium
# or docker-compose (markers: tests/conftest.py and pyproject.toml), in well under a
# minute. The servers' binaries point nowhere here, so a test that starts one without
# its marker fails at once, naming the binary, instead of slowly passing.
FAST_TIER := not integration and not browser and not docker
test-fast: setup
	$(BIN)/ruff check .
	JAVA=/nonexistent/java REDIS_SERVER=/nonexistent/redis-server \
	  REDIS_SENTINEL=/nonexistent/redis-sentinel REDIS_CLI=/nonexistent/redis-cli \
	  DISCOVERY_TEST_CHROMIUM=/nonexistent/chromium \
	  $(PYTEST) -m "$(FAST_TIER)"

# Python 3.13 (Debian trixie's): deploy/py313/root.sh makes a trixie root with debootstrap
# in PY313_ROOT (default /var/cache/search-discovery/trixie-root, outside the tree) once,
# with trixie's ZooKeeper, Redis and Java and a venv of the project, and runs the tests
# there in a mount and PID namespace of their own. About a minute to make the root and
# 20 s for its venv; a second once made (rebuilt when root.sh or deploy/py313/packages
# change, the venv when pyproject.toml does). The network partition tests skip there
# (no ip/iptables: see root.sh). `test-py313` is the whole suite (as `make pytest`;
# Chromium and docker-compose are added to the root for it); `test-py313-ci` is CI's
# share (.ci/run): the fast tier as `test-fast` runs it, then the integration tests
# marked `smoke` (registration, the agent, election and publishing, the live list,
# fan-out, the status command, real processes, Sentinel, TLS, the installed wheel).
PY313       := deploy/py313/root.sh
PY313_PYTEST = /opt/venv/bin/pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=20 \
  -p no:cacheprovider $(PYTEST_ARGS)
.PHONY: test-py313 test-py313-ci
test-py313:
	$(PY313) run --full $(PY313_PYTEST)

test-py313-ci:
	$(PY313) run env JAVA=/nonexistent/java REDIS_SERVER=/nonexistent/redis-server \
	  REDIS_SENTINEL=/nonexistent/redis-sentinel REDIS_CLI=/nonexistent/redis-cli \
	  DISCOVERY_TEST_CHROMIUM=/nonexistent/chromium \
	  $(PY313_PYTEST) -m "$(FAST_TIER)"
	$(PY313) run $(PY313_PYTEST) -m smoke

devcluster: setup
	$(BIN)/discovery devcluster

demo: setup
	$(BIN)/discovery demo

# Every benchmark, one after the other (they would distort each other in parallel);
# each writes bench/results/<name>.json and can also be run alone.
BENCHES := index topk fleet convergence failover fanout zk_load scale zk_watch invalid_children redis_failover throughput verify_load fleet_scale
bench: setup
	@for b in $(BENCHES); do \
	  if [ -f bench/bench_$$b.py ]; then \
	    echo "== bench/bench_$$b.py"; $(BIN)/python bench/bench_$$b.py || exit 1; \
	  fi; \
	done

# A seeded chaos run: a 3-server ZooKeeper ensemble, Redis, 3 search servers and 30
# data servers under load, faults injected for CHAOS_DURATION seconds, the invariants
# checked all along; exits non-zero on any violation. CHAOS_SENTINELS=3 runs Redis as a
# primary, 2 replicas and 3 sentinels and fails the primary over (report: chaos-sentinel.json).
# CHAOS_KINDS=hostile (or any kinds and categories, comma-separated) runs only those.
# CI runs the short ones, single Redis and Sentinel (about 7 minutes in all). The
# single-Redis run (100 s, seed 7) holds the single-Redis kinds (redis_restart and its
# overlap), the first hostile kinds and, since issue 23, zk_disk_full, zk_leader_pause,
# redis_refuses_writes and zk_peer_partition (seed 7's 1st, 6th, 11th and 13th faults;
# 150 s held 22 faults when measured); the Sentinel run is 200 s, seed 7's first 20-odd
# faults of a round of 30 (redis_failover included). The deploy day, a minute or two
# at the end of each round, is left to make soak.
CHAOS_DURATION  ?= 600
CHAOS_SEED      ?= 1
CHAOS_SENTINELS ?= 0
CHAOS_KINDS     ?=
chaos: setup
	$(BIN)/discovery chaos --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) \
	  --redis-sentinels $(CHAOS_SENTINELS) $(if $(CHAOS_KINDS),--kinds $(CHAOS_KINDS)) \
	  --report bench/results/chaos$(if $(filter-out 0,$(CHAOS_SENTINELS)),-sentinel).json

chaos-ci: setup
	$(BIN)/discovery chaos --duration 100 --seed 7
	$(BIN)/discovery chaos --duration 200 --seed 7 --redis-sentinels 3

# Thirty minutes of every fault kind (process faults, network partitions, two at once,
# ZooKeeper and Redis failing short of a crash, deploy day, hostile participants) for
# each seed of SOAK_SEEDS in turn, every invariant checked all along; each seed's report
# (bench/results/soak-<seed>[-sentinel].json) is a row of docs/BENCHMARKS.md's soak
# table, and bench/results/soak[-sentinel].png plots them all over time. Stops at the
# first seed with a violation. SOAK_DURATION=7200 is the two-hour run.
SOAK_DURATION ?= 1800
SOAK_SEEDS    ?= 11
SOAK_SUFFIX    = $(if $(filter-out 0,$(CHAOS_SENTINELS)),-sentinel)
soak: setup
	@for seed in $(SOAK_SEEDS); do \
	  echo "== soak: seed $$seed, $(SOAK_DURATION) s"; \
	  $(BIN)/discovery chaos --duration $(SOAK_DURATION) --seed $$seed \
	    --redis-sentinels $(CHAOS_SENTINELS) \
	    --report bench/results/soak-$$seed$(SOAK_SUFFIX).json || exit 1; \
	done
	$(BIN)/python bench/plot_soak.py \
	  $(foreach seed,$(SOAK_SEEDS),bench/results/soak-$(seed)$(SOAK_SUFFIX).json) \
	  --out bench/results/soak$(SOAK_SUFFIX).png

# Containers (docker-compose.yml). Every image starts FROM debian:bookworm-slim; where no
# registry answers, base-image.sh bootstraps it with debootstrap and `docker import`. The
# project's dependencies come from a wheelhouse built here for the image's Python, so the
# build needs no package index. `docker compose` where the plugin exists, else Debian's
# docker-compose.
BASE_IMAGE    ?= debian:bookworm-slim
RUNTIME_IMAGE := search-discovery-runtime:local
COMPOSE       ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

docker-engine:
	deploy/docker/engine.sh

# The classic builder where the buildx plugin is missing (Debian's docker.io), said
# once here rather than in a deprecation notice per image.
image: export DOCKER_BUILDKIT = $(shell docker buildx version >/dev/null 2>&1 && echo 1 || echo 0)

image: setup docker-engine compose-secrets
	deploy/docker/base-image.sh $(BASE_IMAGE)
	docker build -q --build-arg BASE_IMAGE=$(BASE_IMAGE) --target runtime -t $(RUNTIME_IMAGE) . >/dev/null
	$(BIN)/python deploy/docker/wheelhouse.py --runtime-image $(RUNTIME_IMAGE)
	BASE_IMAGE=$(BASE_IMAGE) $(COMPOSE) build -q

# The credentials docker-compose.yml mounts (deploy/compose/secrets/, never committed):
# random passwords made once and kept, and what is derived from them (the hashed
# ZooKeeper identities, the Redis and Sentinel ACL lines). `make image` runs it.
compose-secrets: setup
	$(BIN)/python deploy/compose_secrets.py

# Not in CI (minutes, and a Docker engine): up, queries, drain a fleet, kill the leader,
# fail Redis over, Prometheus targets, down -v; a summary table, non-zero on any miss.
compose-check: image
	$(BIN)/python deploy/compose_check.py --compose "$(COMPOSE)"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache site
