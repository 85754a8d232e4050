# Two commands do all the set-up on a fresh machine:
#   make demo   - install kproxy in .venv and the system packages (Spark needs a JDK), then run `kproxy demo`
#   make test   - install kproxy, the test tools and the system packages, then run the tests
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow install bytecode system-packages class-archive kafka-jars go-clients third-party-apps kafka-streams-app bench image-check

# Each set-up step prints one line, or its whole output when it fails (scripts/quietly.sh): pip's
# progress, and setuptools' note that an editable install maps the source tree, stay out of the way.
$(BIN)/kproxy: pyproject.toml
	@scripts/quietly.sh "install: kproxy and its extras in $(VENV)" sh -c \
		"$(PY) -m venv $(VENV) && $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -e '.[all]'"
	@touch $@

install: $(BIN)/kproxy

# The tree's own modules compiled to bytecode. The editable install imports them from the source tree, and
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) no process writes what it compiled: every
# `kproxy run`, CLI command and Spark Python worker compiled each module it imported again, about 0.12 s
# of CPU per proxy start (0.60 s against 0.72 s), a few hundred starts a test run. Compiled files that a
# later edit makes stale are ignored by Python (it compares the source's time); this recompiles them.
bytecode: install
	@$(BIN)/python -m compileall -q -j 0 kproxy spark tests scripts

system-packages:
	@scripts/install-system-packages.sh

# Spark's classes in one archive the driver JVM maps at start (kproxy_spark.class_archive): about 30 s once per
# machine and Java/Spark install, then every analysis's Spark starts about 1.7 s sooner.
class-archive: install system-packages
	@scripts/quietly.sh "class archive: Spark's classes, for a quicker start" $(BIN)/python -m kproxy_spark.class_archive

# Apache Kafka's broker and Java client jars (Maven Central, cached per machine under ~/.cache/kproxy/kafka).
kafka-jars: install system-packages
	@scripts/quietly.sh "kafka jars: Apache Kafka's broker and client" $(BIN)/python -m kproxy.kafka.jars

# The franz-go and sarama workload clients (kproxy/workload/clients/go_bridge), built with Go from the Go module
# proxy, once per machine under ~/.cache/kproxy/go-clients: about a minute, outside the suite's time budget.
go-clients: install
	$(BIN)/python -m kproxy.workload.clients.go_build

# Applications the project did not write, built once per machine (franz-go's kgo test binary, from the
# Go module proxy, under ~/.cache/kproxy/apps): about 80 s, before pytest starts, so it is not timed as a test.
third-party-apps: install
	$(BIN)/python -m tests.fixtures.franz_go

# The Kafka Streams word count of tests/apps/streams/ (kafka-streams from Maven Central, compiled with javac;
# cached per machine under ~/.cache/kproxy/apps/kafka-streams-VERSION).
kafka-streams-app: install system-packages
	$(BIN)/python -m tests.fixtures.kafka_streams

# Exit status 1 means the analysis found anomalies: the demo worked.
demo: install bytecode system-packages class-archive
	$(BIN)/kproxy demo $(ARGS) || [ $$? -eq 1 ]

# The container image: built with podman from a Debian base made here (no registry needed), then run
# as users run it (scripts/container-check.py; docs/observability.md, "The image").
image-check: install
	@scripts/install-system-packages.sh --containers
	$(BIN)/python scripts/container-check.py $(ARGS)

bench: install
	$(BIN)/kproxy bench $(ARGS)

test: install bytecode system-packages class-archive kafka-jars go-clients third-party-apps
	scripts/run-tests.sh $(ARGS)

# The slow tests (soaks, benchmarks, third-party applications): the applications are built first, so
# their build is not timed as a test. Needs Go for franz-go.
test-slow: install bytecode system-packages class-archive kafka-jars third-party-apps kafka-streams-app
	scripts/run-tests.sh -m slow $(ARGS)
