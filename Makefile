# inferentia-operator: the commands that matter are `make test` and `make demo`.
# Everything they need is installed here: a virtualenv from PyPI, and the local
# control plane compiled from the Go module proxy (cached outside the checkout).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The targets below depend on `controlplane`, which has just built (or found) the binaries.
export INFERENTIA_CONTROLPLANE_BUILT := 1
CRD    := crds/inferentia.dev_inferentiamodels.yaml

.PHONY: help test test-faults test-kind kind-up kind-down unit e2e lint venv controlplane cluster-up cluster-down crd manifests demo benchmark benchmark-scale benchmark-cores benchmark-batching benchmark-autoscaling benchmark-routing benchmark-cel benchmark-node-views benchmark-disaggregated docs clean
HELM    = $(shell bash cluster/build.sh --print)/helm
CHART   := charts/inferentia-operator

help:
	@echo "make test          the whole suite: unit tests beside the end-to-end tests on a local control plane"
	@echo "make unit          unit tests only (no cluster)"
	@echo "make test-faults   the fault suite alone, with the real-node faults make test leaves out (docs/faults.md)"
	@echo "make test-kind     the end-to-end suite on a kind cluster (Docker, else podman), then kind-down (KEEP_KIND=1 keeps it)"
	@echo "make kind-up       only the kind cluster (kubeconfig: .kind/kubeconfig); make kind-down removes it"
	@echo "make demo          local control plane + operator + samples, until make cluster-down"
	@echo "make cluster-up    start the local control plane (kubeconfig: .cluster/kubeconfig)"
	@echo "make cluster-down  stop it, and the demo operator"
	@echo "make benchmark     print the performance figures (control-plane warm start, time to Ready, planner rate)"
	@echo "make benchmark-scale [N=1000]  the reconcile core at scale, against the bare API (about 15 min at N=1000)"
	@echo "make benchmark-cores     whole chips against NeuronCores: what a mix of models needs, and what one fleet places"
	@echo "make benchmark-batching  the batching front end: fixed windows against adaptive, steady and bursty, 3 runs (RUNS=1 for one)"
	@echo "make benchmark-autoscaling [PEAK_RPS=16]  on the real node: fixed replicas against spec.autoscaling, one load profile (about 20 min)"
	@echo "make benchmark-routing   on the real node: the endpoint picker's routing against the Service's random spread (about 8 min)"
	@echo "make benchmark-cel      the CRD's CEL rules through three CEL libraries against validate's Python twins (docs/design.md, Validation)"
	@echo "make benchmark-node-views [GIB=4]  a second replica's artefact fetch on a node: the cache's copy against linked to its view"
	@echo "make benchmark-disaggregated  prefill and decode pools against aggregated replicas on the same chips, the stand-ins on loopback (about 2 min; POOLS=P[xI]:D[xI], each pool's replicas and chips, default 2x2:1x2; AGGREGATED_INF=2 for aggregated replicas of 2 chips)"
	@echo "make lint          ruff (lint and format) and mypy, as configured in pyproject.toml (make test runs them too)"
	@echo "make crd           regenerate $(CRD) (and the chart's copy) from the pydantic models"
	@echo "make manifests     regenerate manifests/*.yaml from the chart's default values"
	@echo "make docs          regenerate docs/api.md's field reference from the pydantic models"

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	# Envoy's ext_proc API (cluster/endpointpicker.py) in a directory of its own: the package
	# also ships the top-level module cel (CEL's protos), which would shadow the CEL library
	# the rule tests import.
	$(BIN)/pip install --quiet --no-deps --target $(VENV)/xds-protos 'xds-protos==1.85.0'
	touch $@

venv: $(BIN)/.installed

# The Go programs are compiled while the real node's Debian packages and its images' slow
# parts (Debian bases, the operator's layer) are made beside them: the one is CPU-bound, the
# others mostly wait on the network and the disk (docs/development.md).
controlplane: venv
	@rc=0; { bash cluster/node-deps.sh && $(BIN)/python cluster/images.py --parts >/dev/null; } & prep=$$!; \
	  bash cluster/build.sh >/dev/null || rc=$$?; wait $$prep || rc=$$?; exit $$rc

# Three runs at once: the end-to-end tests of the real node (a cluster with it), the longest
# and the one that needs the CPU, first in line for it; beside it, niced, the end-to-end tests
# of the simulated fleet (a cluster of its own, without the real node: they mostly wait on
# the API server and kwok) and the unit suite (a file to a worker: a file's tests share its
# fixtures). The reports of the last two follow; then the unit tests marked exclusive run
# alone (real servers held to deadlines of seconds, which a starved machine missed), and
# the real-node run's red line is printed again if its tests did not run. Any run failing
# fails the target.
test: venv controlplane
	@rc=0; unit_log=$$(mktemp); fleet_log=$$(mktemp); real_log=$$(mktemp); real_rc=$$(mktemp); \
	  nice -n 10 $(BIN)/pytest -m "not cluster and not exclusive" -n auto --dist loadfile >$$unit_log 2>&1 & unit=$$!; \
	  nice -n 10 $(BIN)/pytest -m "cluster and not real_node" >$$fleet_log 2>&1 & fleet=$$!; \
	  trap 'kill $$unit $$fleet 2>/dev/null' INT TERM; \
	  trap 'rm -f $$unit_log $$fleet_log $$real_log $$real_rc' EXIT; \
	  { $(BIN)/pytest -m "cluster and real_node"; echo $$? >$$real_rc; } 2>&1 | tee $$real_log; \
	  [ "$$(cat $$real_rc)" = 0 ] || rc=1; \
	  wait $$fleet || rc=$$?; cat $$fleet_log; \
	  wait $$unit || rc=$$?; cat $$unit_log; \
	  $(BIN)/pytest -m "not cluster and exclusive" -n auto --dist loadfile || rc=$$?; \
	  grep -h "REAL-NODE TESTS DID NOT RUN" $$real_log; exit $$rc

unit: venv
	$(BIN)/pytest -m "not cluster" -n auto --dist loadfile

e2e: venv controlplane
	$(BIN)/pytest -m cluster

test-faults: venv controlplane
	INFERENTIA_REAL_FAULTS=1 $(BIN)/pytest -m faults -v

# The kind cluster (cluster/kindcluster.py): a node image built here, or INFERENTIA_KIND_NODE_IMAGE.
kind-up: venv controlplane
	@bash cluster/kind-deps.sh
	@bash cluster/build.sh --kind >/dev/null
	@$(BIN)/python cluster/kindcluster.py up >/dev/null

kind-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python cluster/kindcluster.py down; fi

# The end-to-end suite against the kind cluster; the cluster goes again after, whatever the result.
test-kind: kind-up
	@rc=0; INFERENTIA_E2E_KIND=$(CURDIR)/.kind $(BIN)/pytest -m cluster || rc=$$?; \
	  if [ -z "$(KEEP_KIND)" ]; then $(MAKE) --no-print-directory kind-down; fi; exit $$rc

cluster-up: venv controlplane
	@$(BIN)/python cluster/localcluster.py up >/dev/null

cluster-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python cluster/demo.py stop 2>/dev/null || true; \
	  $(BIN)/python cluster/localcluster.py down; \
	  if [ -d .kind ]; then $(BIN)/python cluster/kindcluster.py down; fi; fi

demo: venv controlplane
	@$(BIN)/python cluster/demo.py

benchmark: venv controlplane
	@$(BIN)/python cluster/benchmark.py

N ?= 1000
benchmark-scale: venv controlplane
	@$(BIN)/python cluster/benchmark_scale.py --models $(N)

benchmark-cores: venv controlplane
	@$(BIN)/python cluster/benchmark_cores.py

PEAK_RPS ?= 16
benchmark-autoscaling: venv controlplane
	@$(BIN)/python -u cluster/benchmark_autoscaling.py --peak-rps $(PEAK_RPS)

benchmark-routing: venv controlplane
	@$(BIN)/python -u cluster/benchmark_routing.py

benchmark-cel: venv
	@$(BIN)/python cluster/benchmark_cel.py

GIB ?= 4
benchmark-node-views: venv
	@$(BIN)/python cluster/benchmark_node_views.py --gib $(GIB)

RUNS ?= 3
benchmark-batching: venv
	@$(BIN)/python -u cluster/benchmark_batching.py --runs $(RUNS)

benchmark-disaggregated: venv
	@$(BIN)/python -u cluster/benchmark_disaggregated.py --pools $(or $(POOLS),2x2:1x2) $(if $(AGGREGATED_INF),--aggregated-inf $(AGGREGATED_INF))

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

crd: venv
	$(BIN)/inferentia-operator crd > $(CRD)
	cp crds/*.yaml $(CHART)/crds/

docs: venv
	$(BIN)/python -c "from pathlib import Path; from inferentia_operator.core.reference import in_page; \
	  p = Path('docs/api.md'); p.write_text(in_page(p.read_text()))"

manifests: venv controlplane crd
	$(BIN)/python charts/render_manifests.py $(HELM)

clean: cluster-down
	rm -rf $(VENV) .cluster build *.egg-info
