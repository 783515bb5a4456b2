# Every target installs what it needs into .venv first, so a fresh clone needs only Python 3.11, git and make.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit lint install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gpufrac simulate --out report

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/mypy --strict src/gpufrac/contract
	$(BIN)/lint-imports --no-cache

# The control plane (kube-apiserver, kube-scheduler, kube-controller-manager, etcd) and the real node
# (kubelet, kubectl, containerd, runc, CNI plugins, busybox and pause images) for tests/integration, built
# once from Debian packages into ~/.cache/gpufrac (minutes the first time; instant after). See hack/README.md.
.PHONY: kube-bins
kube-bins:
	hack/test-cluster build

# Debian's Chromium, in which the tests open `gpufrac report`'s page (hack/ensure-chromium: apt, once).
.PHONY: browser
browser:
	hack/ensure-chromium

# GPUFRAC_REQUIRE_BROWSER: the browser test fails rather than skips where Chromium is missing.
test: lint kube-bins browser
	GPUFRAC_REQUIRE_BROWSER=1 $(BIN)/pytest

# Everything but tests/integration: no control plane to build or start, a minute or two.
unit: $(STAMP)
	$(BIN)/pytest -m "not integration"

clean:
	rm -rf $(VENV) report .pytest_cache .mypy_cache .ruff_cache
