# genrm-operator: the two commands users need are `make dev` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt 2>/dev/null | sha1sum | cut -c1-12)
CLUSTER ?= local
VERSION := $(shell sed -n "s/^version = \"\(.*\)\"/\1/p" pyproject.toml)

.PHONY: venv tools test unit lint e2e dev crds sglang-contract bench-gateway bench-autoscaler images control-plane clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

## tools: promtool and prometheus (Debian's prometheus package) for the observability tests
tools:
	@command -v promtool >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus)

## test: every check and test (lint, types, layering, unit, gateway, cluster e2e)
test: venv lint unit e2e

lint: venv
	$(VENV)/bin/ruff check operator gateway engine hack tests e2e
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: venv tools
	$(PY) -m pytest -q tests

e2e: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m pytest -q e2e

control-plane:
	@hack/control-plane.sh >/dev/null

## dev: the operator on a local embedded cluster with simulated engines
dev: venv control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m genrm_cluster.dev --cluster $(CLUSTER)

## crds: regenerate crds/ and the chart's copy from the pydantic models
crds: venv
	$(PY) -m genrm_operator.crdgen

## sglang-contract: re-read the pinned SGLang wheel (network) into engine/genrm_sim/sglang_contract.json
sglang-contract: venv
	$(PY) hack/sglang_contract.py

bench-gateway: venv
	$(PY) -m genrm_gateway.bench

bench-autoscaler: venv control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m e2e.bench_autoscaler

images:
	@command -v docker >/dev/null || { echo "make images needs a Docker engine"; exit 1; }
	for t in operator gateway sim engine; do docker build --target $$t -t genrm/$$t:$(VERSION) . || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
