# gpuledger — the two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export GPULEDGER_CACHE ?= $(HOME)/.cache/gpuledger
export K8S_VERSION ?= 1.37.2
export KUBE_APISERVER ?= $(GPULEDGER_CACHE)/kube-apiserver-v$(K8S_VERSION)
export KUBE_CONTROLLER_MANAGER ?= $(GPULEDGER_CACHE)/kube-controller-manager-v$(K8S_VERSION)
export KUBELET ?= $(GPULEDGER_CACHE)/kubelet-v$(K8S_VERSION)
export KUBE_SCHEDULER ?= $(GPULEDGER_CACHE)/kube-scheduler-v$(K8S_VERSION)
export KUBE_PROXY ?= $(GPULEDGER_CACHE)/kube-proxy-v$(K8S_VERSION)
COREDNS := $(GPULEDGER_CACHE)/coredns-v1.12.1
export HELM_VERSION ?= 3.22.0
HELM := $(GPULEDGER_CACHE)/helm-v$(HELM_VERSION)-release

.PHONY: all venv apiserver helm runtime runtime-build image test test-versions test-fast lint demo bench bench-cluster simulate clean

all: test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# kube-apiserver and kube-controller-manager built from the k8s.io/kubernetes Go module, cached outside the repo
$(KUBE_APISERVER) $(KUBE_CONTROLLER_MANAGER):
	bash devcluster/build_kube_components.sh

# the real node's kubelet (tests/e2e/test_real_node.py), built the same way
$(KUBELET):
	COMPONENTS=kubelet bash devcluster/build_kube_components.sh

# the default scheduler, for the pods that waited in the ledger's line (devcluster/scheduler.py)
$(KUBE_SCHEDULER):
	COMPONENTS=kube-scheduler bash devcluster/build_kube_components.sh

# a Service's virtual IP and cluster DNS, for the product deployed as pods (devcluster/services.py)
$(KUBE_PROXY):
	COMPONENTS=kube-proxy bash devcluster/build_kube_components.sh

$(COREDNS):
	bash devcluster/build_coredns.sh

apiserver: $(KUBE_APISERVER) $(KUBE_CONTROLLER_MANAGER) $(KUBELET) $(KUBE_SCHEDULER) $(KUBE_PROXY) $(COREDNS)

# helm (tests/deploy/test_helm.py renders charts/gpuledger with it), built from helm.sh/helm/v3 the same way
$(HELM):
	bash charts/build_helm.sh

helm: $(HELM)

# the real node's containerd 2 (+ its runc shim, ctr) and runc, built from their Go modules and cached outside
# the repo (devcluster/build_runtime.sh; kubelet 1.36+ no longer supports Debian's containerd 1.6)
export CONTAINERD_VERSION ?= 2.4.2
CONTAINERD_BIN := $(GPULEDGER_CACHE)/containerd-v$(CONTAINERD_VERSION)/bin
$(CONTAINERD_BIN)/runc:
	bash devcluster/build_runtime.sh

runtime-build: $(CONTAINERD_BIN)/runc

# the real node's runtime: containerd 2 and runc built above, then the CNI plugins and static busybox from
# Debian's packages; installs only what is missing (as root, or through sudo)
runtime: runtime-build
	@bash devcluster/runtime.sh || { echo "the real node's runtime could not be installed: run 'sudo bash devcluster/runtime.sh'" >&2; exit 1; }

# the product image without docker or a registry, from the Dockerfile's recipe with Debian's packages
# (mmdebstrap) and PyPI: an OCI archive cached in $(GPULEDGER_CACHE)/images, which the real node imports
# (root; docs/deployment.md, "Building the image without a registry")
image: venv runtime
	$(PY) -m devcluster.product_image

# ruff (rules and format) over LINT_PATHS, mypy over the product code among them, then the import-linter
# contracts. A subset checks only those paths: make lint LINT_PATHS="gpuledger/certs gpuledger/sim" (mypy still reads
# the modules they import, for their types, but reports only the errors in TYPE_PATHS).
LINT_PATHS ?= gpuledger devcluster tests
TYPE_PATHS ?= $(filter-out tests tests/%,$(LINT_PATHS))

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(if $(strip $(TYPE_PATHS)),$(VENV)/bin/mypy --follow-imports=silent $(TYPE_PATHS))
	$(VENV)/bin/lint-imports

# the whole suite: unit, property, real TLS + real Ray, end to end against kube-apiserver + etcd, and a real
# kubelet. GPULEDGER_REQUIRE_ALL: a missing part fails its tests (naming the command that provides it) instead
# of skipping them; only the tests marked `gpu` skip, where no NVIDIA GPU answers.
# TEST_WORKERS: pytest-xdist workers, each a test module at a time (the real node's modules one after another on
# one worker: tests/conftest.py); 2 keeps both cores of the smallest machine busy, 0 runs in this process
TEST_WORKERS ?= 2
test: venv apiserver helm runtime
	GPULEDGER_REQUIRE_ALL=1 $(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# the end-to-end and real-node modules once per Kubernetes version, each version's binaries built on demand
# (devcluster/build_kube_components.sh, cached like the default's), then a pass/fail table. A version whose
# build fails reads "build failed"; each run's output is kept in $(VERSIONS_LOG_DIR)/<version>.log.
K8S_VERSIONS ?= 1.35.4 1.36.3 1.37.2 1.38.0-beta.0
VERSION_TESTS ?= tests/e2e tests/devcluster tests/ray tests/sync tests/node_agent tests/service tests/cli
VERSIONS_LOG_DIR ?= $(GPULEDGER_CACHE)/test-versions
# VERSION=NODE_VERSION: a version whose kubelet and kube-proxy run at NODE_VERSION (a skew Kubernetes supports:
# the kubelet up to three minors older). 1.38.0-beta.0's node components need sigs.k8s.io/iptables-wrappers
# v1.0.0, which the module proxy here refuses, so its control plane runs with the 1.37.2 kubelet.
K8S_NODE_VERSIONS ?= 1.38.0-beta.0=1.37.2
CONTROL_PLANE_COMPONENTS := kube-apiserver kube-controller-manager kube-scheduler
NODE_COMPONENTS := kubelet kube-proxy
test-versions: venv helm runtime $(COREDNS)
	@mkdir -p $(VERSIONS_LOG_DIR); rm -f $(VERSIONS_LOG_DIR)/results; \
	for v in $(K8S_VERSIONS); do \
	  log=$(VERSIONS_LOG_DIR)/$$v.log; start=$$SECONDS; \
	  node=$$(echo " $(K8S_NODE_VERSIONS) " | sed -n "s/.* $$v=\([^ ]*\) .*/\1/p"); node=$${node:-$$v}; \
	  echo "== Kubernetes $$v, kubelet and kube-proxy $$node (output: $$log)"; \
	  if ! { env K8S_VERSION=$$v COMPONENTS="$(CONTROL_PLANE_COMPONENTS)" bash devcluster/build_kube_components.sh && \
	         env K8S_VERSION=$$node COMPONENTS="$(NODE_COMPONENTS)" bash devcluster/build_kube_components.sh; } >$$log 2>&1; then \
	    result="build failed"; \
	  else \
	    env -u KUBE_APISERVER -u KUBE_CONTROLLER_MANAGER -u KUBE_SCHEDULER K8S_VERSION=$$v \
	      KUBELET=$(GPULEDGER_CACHE)/kubelet-v$$node KUBE_PROXY=$(GPULEDGER_CACHE)/kube-proxy-v$$node \
	      GPULEDGER_REQUIRE_ALL=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m e2e \
	      $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) \
	      $(VERSION_TESTS) $(PYTEST_ARGS) >>$$log 2>&1; rc=$$?; \
	    summary="$$(grep -E '[0-9]+ (passed|failed|error)' $$log | grep -E ' in [0-9.]+s' | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$$//')"; \
	    if [ $$rc -eq 0 ]; then result="pass"; else result="FAIL (exit $$rc)"; fi; \
	    result="$$result  $$summary"; \
	  fi; \
	  if [ "$$node" != "$$v" ]; then result="$$result (kubelet, kube-proxy $$node)"; fi; \
	  printf '%-16s %-6s %s\n' "$$v" "$$((SECONDS - start))s" "$$result" >> $(VERSIONS_LOG_DIR)/results; \
	  tail -1 $(VERSIONS_LOG_DIR)/results; \
	done; \
	echo; printf '%-16s %-6s %s\n' version time result; cat $(VERSIONS_LOG_DIR)/results; \
	! grep -qv '  *pass ' $(VERSIONS_LOG_DIR)/results

# everything that needs no control plane
test-fast: venv
	$(VENV)/bin/pytest -m "not e2e" $(PYTEST_ARGS)

# local control plane (or the current kubeconfig with DEMO_ARGS=--use-current-kubeconfig), webhook + local Ray,
# sample workloads. The demo drives the test control plane (devcluster/demo.py) of this checkout.
# the demo's cluster needs only the control plane and kube-scheduler (no real node, no cluster DNS)
demo: venv $(if $(findstring --use-current-kubeconfig,$(DEMO_ARGS)),,$(KUBE_APISERVER) $(KUBE_CONTROLLER_MANAGER) $(KUBE_SCHEDULER))
	$(VENV)/bin/gpuledger demo $(DEMO_ARGS)

# every benchmark, one after another (each prints ratios to a baseline measured in the same run)
# BENCH_SCALE= (empty) skips the 65,000-node rows (a few minutes, about 1 GB): the waiting line's then runs at
# 5,000 nodes and 2,000 waiting pods
BENCH_SCALE ?= --scale
bench: venv apiserver
	$(PY) tests/benchmarks/bench_allocator.py
	$(if $(strip $(BENCH_SCALE)),$(PY) tests/benchmarks/bench_allocator.py $(BENCH_SCALE))
	$(PY) tests/benchmarks/bench_waiting.py $(if $(strip $(BENCH_SCALE)),,--nodes 5000 --waiting 2000)
	$(PY) tests/benchmarks/bench_preemption.py $(if $(strip $(BENCH_SCALE)),,--nodes 5000)
	$(PY) tests/benchmarks/bench_queue_ledger.py
	$(PY) tests/benchmarks/bench_gang_scale.py
	$(PY) tests/benchmarks/bench_handler_cpu.py
	$(PY) tests/benchmarks/bench_webhook.py --in-process
	$(PY) tests/benchmarks/bench_pod_create.py
	$(PY) tests/benchmarks/bench_api_requests.py
	$(PY) tests/benchmarks/bench_simulator.py
	$(PY) tests/benchmarks/bench_cluster.py --nodes 24 --scenario fill,gang,never,free,reclaim-one,reclaim-large

# the cluster-scale scenarios at the peers' size, 500 nodes x 8 GPUs, with the controller-manager's default client
# rate limits and with a large cluster's (docs/benchmarks.md, "Cluster-scale figures"; most of an hour on 2 cores)
bench-cluster: venv apiserver
	$(PY) tests/benchmarks/bench_cluster.py --nodes 500

simulate: venv
	$(VENV)/bin/gpuledger simulate --trace ../shared/traces/openb --workload default --seeds 10

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
