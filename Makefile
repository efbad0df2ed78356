# Rift: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export RIFT_DATA_DIR ?= $(CURDIR)/var
# Python writes the bytecode of what it imports (.venv is installed with --no-compile):
# where PYTHONDONTWRITEBYTECODE is set (as on these machines) every process compiled
# all it imported again, 1.0 of a `rift` command's 1.7 s, in each `rift serve` the
# tests start too.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test ci soak check bench clean

setup:
	@scripts/setup.sh

## run: install what is missing, start libvirtd, build the tiny and debian images, and start Rift
## on 127.0.0.1:8080 (SQLite in ./var, VMs on the local libvirt, a pool of debian: one running,
## two saved; RIFT_DEFAULT_POOL= turns it off)
run: setup
	@scripts/libvirt.sh
	$(VENV)/bin/rift image build tiny
	$(VENV)/bin/rift image build debian
	RIFT_HYPERVISOR_URI=$${RIFT_HYPERVISOR_URI:-qemu:///system} \
	  RIFT_DEFAULT_POOL=$${RIFT_DEFAULT_POOL-debian:1:2} $(VENV)/bin/rift serve

## test: install what is missing and run the whole suite
test: setup
	@scripts/libvirt.sh
	@scripts/test.sh

## ci: what CI runs on a fresh clone (.ci/run): make check, then make test
ci: check test

## soak: the long forms (not in CI): the reliability campaign's (10,000 fuzz cases per door,
## 50+ kill -9 trials, a minute of 32 agents; prints the table and keeps it as JSON), then
## the real-guest tests marked `soak` at their long size (tests/support/soak.py)
soak: setup
	@scripts/libvirt.sh
	@mkdir -p $(RIFT_DATA_DIR)
	RIFT_SOAK=1 RIFT_RELIABILITY_REPORT=$(RIFT_DATA_DIR)/reliability-soak.json \
	  scripts/test.sh tests/reliability --timeout=3600
	RIFT_SOAK=1 scripts/test.sh tests -m soak --timeout=3600

## check: ruff and mypy
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

## bench: benchmarks that print figures (not part of the test pass)
bench: setup
	$(PY) -m bench $(BENCH)

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
