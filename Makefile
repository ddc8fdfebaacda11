# genrm-operator: the two commands users need are `make dev` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml hack/pyproject.toml client/pyproject.toml constraints.txt 2>/dev/null | sha1sum | cut -c1-12)
CLUSTER ?= local
VERSION := $(shell sed -n "s/^version = \"\(.*\)\"/\1/p" pyproject.toml)

.PHONY: venv tools test unit lint e2e test-real-engine engine-env soak dev crds docs sglang-contract bench-gateway bench-parts bench-autoscaler bench-spread bench-scale-to-zero bench-judge-switch bench-operator images control-plane clean

## venv: the project, its trainer-side client (client/pyproject.toml: genrm-client, installed alone on
## training machines) and its development tools (hack/pyproject.toml: local cluster, benchmarks, test
## helpers; never shipped), all editable
$(STAMP): pyproject.toml hack/pyproject.toml client/pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]' -e ./hack -e ./client
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

## tools: Debian packages the tests need: prometheus (promtool) for the observability tests,
## nftables for the local cluster's kube-proxy, iptables and conntrack (kube-proxy's companions)
TOOLS := promtool:prometheus nft:nftables iptables-save:iptables conntrack:conntrack
tools:
	@missing="$(foreach t,$(TOOLS),$(shell command -v $(word 1,$(subst :, ,$(t))) >/dev/null || echo $(word 2,$(subst :, ,$(t)))))"; \
	if [ -n "$${missing// }" ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; fi

## test: every check and test (lint, types, layering, control plane, images, unit, gateway, cluster e2e with
## the chart run from its images, 3-min soak, the real-engine lane); a test of the images fails, not skips,
## when they were not built
test: export GENRM_IMAGES_REQUIRED=1
test: venv tools lint control-plane images unit e2e test-real-engine

lint: venv
	$(VENV)/bin/ruff check operator gateway contract engine client hack bench tests e2e
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy hack/sglang_contract.py
	$(VENV)/bin/lint-imports

unit: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh 2>/dev/null)" $(PY) -m pytest -q tests

e2e: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh 2>/dev/null)" $(PY) -m pytest -q e2e --ignore=e2e/realengine

## test-real-engine: the real-engine lane alone: real SGLang 0.5.23 on CPU (a tiny local model) behind the
## gateway on the local cluster, and the simulator diffed against it; ends with its real-engine-summary line
test-real-engine: venv tools control-plane engine-env
	@summary="$$(mktemp)"; GENRM_REAL_ENGINE_SUMMARY="$$summary" GENRM_BIN_DIR="$$(hack/control-plane.sh 2>/dev/null)" \
	  $(PY) -m pytest -q e2e/realengine; status=$$?; cat "$$summary"; rm -f "$$summary"; exit $$status

## engine-env: install (cold: about 4 minutes, 7 GB) or reuse the real engine's environment in ~/.cache/genrm-operator
engine-env:
	@echo "==> real engine: SGLang 0.5.23 (CPU) environment"
	@hack/engine-env.sh >/dev/null

## soak: the e2e soak alone for 8 minutes (make test runs a 3-minute one); SEED=n repeats a run
soak: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh 2>/dev/null)" GENRM_SOAK_SECONDS=$${GENRM_SOAK_SECONDS:-480} \
	  GENRM_SOAK_SEED=$(SEED) $(PY) -m pytest -q -s e2e/test_soak.py

## control-plane: build (cold: about 10 minutes on 2 cores, a progress line per binary every 30 s)
## or reuse the pinned binaries in ~/.cache/genrm-operator, before any test starts
control-plane:
	@echo "==> control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubectl, helm"
	@hack/control-plane.sh >/dev/null

## dev: the operator on a local embedded cluster with simulated engines (ENGINE=sglang: real SGLang on CPU)
ENGINE ?= sim
dev: venv control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m genrm_cluster.dev --cluster $(CLUSTER) --engine $(ENGINE)

## crds: regenerate crds/ and the chart's copy from the pydantic models
crds: venv
	$(PY) -m genrm_operator.crdgen

## docs: regenerate docs/reference.md (every GenRMPool field) from the pydantic models; make test fails
## when it is stale
docs: venv
	$(PY) -m genrm_operator.docgen

## sglang-contract: re-read the pinned SGLang wheel (network) into engine/genrm_sim/sglang_contract.json
sglang-contract: venv
	$(PY) hack/sglang_contract.py

## bench-gateway: the gateway beside the engine directly and nginx (ENGINE=sglang: in front of real SGLang on CPU)
bench-gateway: venv
	$(PY) -m bench.gateway --engine $(ENGINE)

## bench-parts: the gateway's HTTP server and engine client beside maintained alternatives
## (uvicorn's h11 protocol, granian; aiohttp, httpx), in one run
bench-parts: venv
	$(PY) -m bench.parts

bench-autoscaler: venv control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m bench.autoscaler

## bench-spread: per-replica request share, p99 and hand-backs after a scale 1 -> 4 under 8, 25 and 64
## keep-alive client connections through the Service (CONNECTIONS=n,... to choose)
bench-spread: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m bench.spread $(if $(CONNECTIONS),--connections $(CONNECTIONS))

## bench-scale-to-zero: a judge phase on a pool that idled to zero, cold and with a demand hint 60 s ahead
## (first answers beside the steady p50, requests held at zero, idle -> zero time)
bench-scale-to-zero: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m bench.scale_to_zero

## bench-judge-switch: a blue/green judge switch on a pool of 4 replicas under step load (change to
## promotion, GPU-seconds beyond the pool, steps answered by two judges, verdicts lost)
bench-judge-switch: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m bench.judge_switch

## bench-operator: operator reaction, publish overhead and cost beside the ReplicaSet controller;
## SIZES=PxR,... (pools x replicas), MODE=hollow|real|both (default both: 5x3,20x3 real, 10x5,50x20 hollow)
bench-operator: venv tools control-plane
	GENRM_BIN_DIR="$$(hack/control-plane.sh)" $(PY) -m bench.operator_storm $(if $(SIZES),--sizes $(SIZES)) \
	  $(if $(filter hollow,$(MODE)),--hollow) $(if $(filter real,$(MODE)),--real)

## images: the operator, gateway and simulator images from the Dockerfile: with Docker where its engine
## runs (and then the engine image too), else with buildah on a local Debian base (docs/development.md#images;
## cold: about 7 minutes, then only what changed)
images:
	hack/images.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
