# bkaudit developer entry points. `make test` and `make demo` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export BKAUDIT_CACHE ?= $(HOME)/.cache/bkaudit

.PHONY: test lint format proto java-deps bookkeeper-deps pulsar-deps helm-deps kube-deps oxia-deps prometheus-deps s3-deps image airflow chromium venv bytecode demo bench-metadata bench-scale bench-watch clean soak soak-scale interop-matrix

venv: $(VENV)/.installed

## Byte-compile our packages, as pip does when it installs one: with PYTHONDONTWRITEBYTECODE
## set (some CI machines), every bkaudit and bookie process would compile them again.
bytecode: venv
	$(PY) -c 'from tests.cli_helpers import byte_compile; byte_compile()'

$(VENV)/.installed: pyproject.toml
	PYTHON=$(PYTHON) VENV=$(VENV) scripts/install_venv.sh
	touch $@

java-deps: venv
	PY=$(PY) scripts/install_java_deps.sh

## Apache BookKeeper 4.17 jars and our Java interop driver (tests/interop).
bookkeeper-deps: java-deps
	scripts/install_bookkeeper.sh

## Helm, built from its Go module, for the chart's tests (tests/deploy/test_helm_chart.py).
helm-deps:
	scripts/install_helm.sh >/dev/null

## The bkaudit and bkaudit-spark images (podman; base made by mmdebstrap), saved as OCI archives
## in dist/images/ (docs/images.md). tests/deploy/test_images.py builds them the same way.
image:
	scripts/build_images.sh

## The Oxia server, built from its Go module, for the Oxia tests (bklib/testing/oxiaserver.py).
oxia-deps:
	scripts/install_oxia.sh >/dev/null

## Prometheus's promtool, built from its Go module, for the alert rules' tests (tests/promtool.py).
prometheus-deps:
	scripts/install_prometheus.sh >/dev/null

## s3proxy from Maven Central, the S3-compatible server of the object-store tests
## (bklib/testing/s3server.py); hadoop-aws, the AWS SDK bundle (560 MB) and bkaudit's Delta
## log store for Spark on S3 (jobs/spark/s3.py), compiled with the JDK bookkeeper-deps installs.
s3-deps: venv bookkeeper-deps
	$(PY) -m bklib.testing.s3server
	$(PY) -m jobs.spark.s3 >/dev/null

## kube-apiserver and etcd, built from their Go modules, to `helm install` the chart into.
kube-deps:
	scripts/install_kube.sh >/dev/null

## Apache Pulsar 4.0 broker jars (with Pulsar's BookKeeper metadata driver) for tests/pulsar.
pulsar-deps: java-deps
	scripts/install_pulsar.sh >/dev/null

## Airflow 3 in its own virtualenv (.venv-airflow) for the DAG tests.
airflow:
	scripts/install_airflow.sh

## The DAG tests and `airflow dags test` on Airflow 2.10 too (.venv-airflow2; not in `make test`).
.PHONY: airflow2 airflow2-test
airflow2:
	AIRFLOW_LINE=2 scripts/install_airflow.sh
airflow2-test: venv airflow2
	AIRFLOW_VENV=.venv-airflow2 BKAUDIT_AIRFLOW_MAJOR=2 $(PY) -m pytest -q tests/airflow
	AIRFLOW_VENV=.venv-airflow2 tests/airflow/dags_test_sandbox.sh

## Debian's headless Chromium for the HTML report test.
chromium:
	scripts/install_chromium.sh

## ruff, mypy, and the layout rules no linter has: no import cycle among bklib's and jobs'
## modules (deferred imports included) and no product file over 800 lines.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_import_cycles.py tests/unit/test_file_sizes.py

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## The whole suite: environment, ZooKeeper and BookKeeper, Airflow, Chromium, lint, every test.
## Two pytest processes (most tests wait on servers, not on the CPU); each takes whole files,
## so a module's fixtures stay in one process. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: venv java-deps bookkeeper-deps pulsar-deps helm-deps kube-deps oxia-deps prometheus-deps s3-deps airflow chromium lint bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

## Chaos soak (30 min; tests/soak), kill campaign (25 SIGKILLs of rereplicate), 1,000
## randomized ledger schedules, and `airflow dags test` of the DAG on a sandbox (Airflow 3).
## `make test` runs a short soak and kill campaign. The seed is printed; replay one with
## `make soak SOAK_SEED=<seed>`.
SOAK_MINUTES ?= 30
SOAK_KILLS ?= 25
ifndef SOAK_SEED
SOAK_SEED := $(shell date +%s)
endif
soak: venv java-deps bookkeeper-deps airflow bytecode
	$(PY) -m pytest -q -s tests/soak/test_chaos_soak.py \
		--soak-minutes $(SOAK_MINUTES) --soak-seed $(SOAK_SEED)
	$(PY) -m pytest -q -s tests/soak/test_kill_campaign.py \
		--soak-kills $(SOAK_KILLS) --soak-seed $(SOAK_SEED)
	$(PY) -m pytest -q -s tests/integration/test_ledger_random_schedules.py \
		--schedules 1000 --timeout 3600
	tests/airflow/dags_test_sandbox.sh

## BookKeeper version matrix: interop cells 1, 3, 5, 6 and 9 against the newest 4.16, 4.17 and
## 4.18 (tests/interop/versions.py), one table per version (docs/interop.md). `make test` runs
## 4.17 plus cells 1 and 3 of one other line in rotation; pick lines with `make interop-matrix BK_LINES=4.18`.
BK_LINES ?= 4.16,4.17,4.18
interop-matrix: venv java-deps
	$(PY) -m tests.interop.matrix --versions $(BK_LINES)

## bkaudit's wheel in dist/ (bkaudit-X.Y.Z-py3-none-any.whl): what `pip install .` builds, for
## a host without the checkout (`pip install dist/bkaudit-*.whl`; docs/deploy.md).
.PHONY: wheel
wheel: venv
	rm -rf build  # setuptools' staging area: a module deleted since the last build stays in it
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps -w dist .

## Regenerate bklib/proto/*_pb2.py from our .proto files.
proto: venv
	scripts/gen_proto.sh

## The main story on the embedded sandbox.
demo: venv java-deps bytecode
	$(PY) -m jobs.cli demo

bench-metadata: venv java-deps
	$(PY) bench/metadata_scan.py

## bkaudit at production size on the scale harness (docs/scale.md): SCALE_LEDGERS ledgers on 100
## bookie identities, each check and the repair on both executors, figures appended to
## SCALE_JSON; then the executors' crossover table and chart (docs/executors.md) from them.
## `make test` runs the 3,000-ledger variant as a test of correctness.
SCALE_LEDGERS ?= 100000
SCALE_CHECKS ?= lost,sample
SCALE_JSON ?= bench-scale.jsonl
bench-scale: venv java-deps
	$(PY) bench/scale.py --ledgers $(SCALE_LEDGERS) --bookies 100 --executors local,spark \
		--checks $(SCALE_CHECKS) --repair --repair-executors local,spark --json $(SCALE_JSON)
	$(PY) bench/executor_crossover.py $(SCALE_JSON)

## Java AutoRecovery beside `bkaudit watch` on the scale farm (bench/autorecovery_farm.py): one of
## 100 identities lost at AR_LEDGERS ledgers, each side on a fresh farm (docs/benchmarks.md).
.PHONY: bench-autorecovery-farm
AR_LEDGERS ?= 100000
AR_JSON ?= bench-autorecovery-farm.jsonl
bench-autorecovery-farm: venv java-deps bookkeeper-deps
	$(PY) bench/autorecovery_farm.py --ledgers $(AR_LEDGERS) --bookies 100 --json $(AR_JSON) \
		--project-to 1000000

## The watch at production size (bench/watch_scale.py): its take-over, idle ZooKeeper load, and
## its reaction to one lost identity of 100 at SCALE_LEDGERS ledgers (docs/watch.md, "The index").
bench-watch: venv java-deps
	$(PY) bench/watch_scale.py --ledgers $(SCALE_LEDGERS) --bookies 100 --json $(SCALE_JSON)

## Two watch replicas for SOAK_SCALE_SECONDS on a farm of SCALE_LEDGERS ledgers under faults on a
## schedule: losses, the leader killed, its session expired, ZooKeeper restarted, a stalled
## bookie (bench/watch_soak.py). The short variant in `make test` is
## tests/integration/test_watch_index_reaction.py with tests/integration/test_bookie_index.py.
SOAK_SCALE_SECONDS ?= 3600
soak-scale: venv java-deps
	$(PY) bench/watch_soak.py --ledgers $(SCALE_LEDGERS) --bookies 100 \
		--duration $(SOAK_SCALE_SECONDS) --json $(SCALE_JSON)

clean:
	rm -rf $(VENV) .venv-airflow .venv-airflow2 .pytest_cache .ruff_cache build *.egg-info
