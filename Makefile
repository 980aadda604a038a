# vmshim — containerd-shim-vm-v2
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO       ?= go
PREFIX   ?= /usr/local
OUT      := $(CURDIR)/_output
BIN      := $(OUT)/bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -s -w -X github.com/vmshim/vmshim/shim.Version=$(VERSION) -X github.com/vmshim/vmshim/shim.Revision=$(REVISION)

# Downloads and builds that survive a fresh clone: containerd, test guests.
export VMSHIM_CACHE ?= $(HOME)/.cache/vmshim
CONTAINERD_VERSION ?= v2.4.2
CONTAINERD_DIR := $(VMSHIM_CACHE)/tools/containerd-$(CONTAINERD_VERSION)
NERDCTL_VERSION ?= v2.0.0
NERDCTL        := $(VMSHIM_CACHE)/tools/nerdctl-$(NERDCTL_VERSION)/nerdctl
# cri-tools' CRI validation suite, which TestCritest runs.
CRITEST_VERSION ?= v1.37.0
CRITEST        := $(VMSHIM_CACHE)/tools/cri-tools-$(CRITEST_VERSION)/critest
GUEST_DIR      := $(VMSHIM_CACHE)/guest
# The single-node cluster of the Kubernetes tests (integration/setup/kube.sh).
ETCD_VERSION ?= v3.6.16
KUBE_VERSION ?= v1.37.2
ETCD_DIR     := $(VMSHIM_CACHE)/tools/etcd-$(ETCD_VERSION)
KUBE_DIR     := $(VMSHIM_CACHE)/tools/kubernetes-$(KUBE_VERSION)
export PATH := /usr/local/go/bin:$(PATH)

.PHONY: help build install setup deps kube guest cloud-guest uefi-guest unit fuzz integration test test-reliability bench demo clean

help: ## show this help
	@awk -F':.*## ' '/^[a-z0-9-]+:.*## / {printf "  %-17s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build the static shim, its pause program and vmshim-pack into _output/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

install: build ## install the shim, vmshim-pause and vmshim-pack into $(PREFIX)/bin
	install -D -m 0755 $(BIN)/vmshim-pause $(DESTDIR)$(PREFIX)/bin/vmshim-pause
	install -D -m 0755 $(BIN)/containerd-shim-vm-v2 $(DESTDIR)$(PREFIX)/bin/containerd-shim-vm-v2
	install -D -m 0755 $(BIN)/vmshim-pack $(DESTDIR)$(PREFIX)/bin/vmshim-pack

setup: deps kube ## install and build everything the tests need (idempotent, cached)

deps: ## install Debian packages, build containerd, its runc shim, nerdctl and critest (idempotent, cached)
	CONTAINERD_VERSION=$(CONTAINERD_VERSION) NERDCTL_VERSION=$(NERDCTL_VERSION) CRITEST_VERSION=$(CRITEST_VERSION) integration/setup/deps.sh >/dev/null

kube: deps ## build etcd and Kubernetes for the Kubernetes tests (idempotent, cached)
	ETCD_VERSION=$(ETCD_VERSION) KUBE_VERSION=$(KUBE_VERSION) integration/setup/kube.sh >/dev/null

guest: deps build ## build the test guests from Debian packages (cached)
	VMSHIM_PACK=$(BIN)/vmshim-pack integration/guest/build.sh $(GUEST_DIR)

cloud-guest: guest ## build the Debian cloud-init test guest with debootstrap (cached)
	VMSHIM_PACK=$(BIN)/vmshim-pack integration/guest/cloud.sh $(GUEST_DIR)

uefi-guest: guest ## build the UEFI, Secure Boot and CD-ROM test guests (cached)
	VMSHIM_PACK=$(BIN)/vmshim-pack integration/guest/uefi.sh $(GUEST_DIR)

unit: ## run the unit tests under -race (those needing containerd use it once `make setup` built it)
	@SECONDS=0; status=0; \
	$(GO) vet ./... && \
	VMSHIM_CONTAINERD=$$([ -x $(CONTAINERD_DIR)/containerd ] && echo $(CONTAINERD_DIR)) $(GO) test -race -count=1 ./... || status=$$?; \
	echo "unit: took $$SECONDS s"; exit $$status

# How long `make fuzz` runs each fuzz target; `go test` alone replays
# the seed corpora under testdata/fuzz. A target fails when fuzzing
# fails, except for the one failure Go's own fuzz coordinator makes up
# (go.dev/issue/75804, fixed in Go 1.27): "context deadline exceeded" at
# the end of FUZZTIME with no failing input written.
FUZZTIME ?= 10s

fuzz: ## run every Go fuzz target for FUZZTIME (default 10s) each
	@set -e; SECONDS=0; log=$$(mktemp); trap 'rm -f $$log; echo "fuzz: took $$SECONDS s"' EXIT; \
	for file in $$(git ls-files '*_fuzz_test.go'); do \
		dir=$$(dirname $$file); \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "fuzz: $$target ($$dir) for $(FUZZTIME)"; \
			before=$$(ls $$dir/testdata/fuzz/$$target 2>/dev/null | wc -l); \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s -parallel 1 ./$$dir/ 2>&1 | tee $$log; \
			status=$${PIPESTATUS[0]}; after=$$(ls $$dir/testdata/fuzz/$$target 2>/dev/null | wc -l); \
			if [ $$status != 0 ]; then \
				if [ "$$after" = "$$before" ] && grep -qx '    context deadline exceeded' $$log; then \
					echo "fuzz: $$target stopped at its deadline with no failing input (Go's fuzztime race, go.dev/issue/75804): not a finding"; \
				else \
					exit 1; \
				fi; \
			fi; \
		done; \
	done

# What the integration tests need to find. `setup` has built the
# cluster's binaries, so the Kubernetes tests fail rather than skip
# without them.
IT_ENV := VMSHIM_INTEGRATION=1 VMSHIM_BIN=$(BIN) VMSHIM_CONTAINERD=$(CONTAINERD_DIR) VMSHIM_GUEST=$(GUEST_DIR) \
	VMSHIM_NERDCTL=$(NERDCTL) VMSHIM_CRITEST=$(CRITEST) VMSHIM_KUBE=$(KUBE_DIR) VMSHIM_ETCD=$(ETCD_DIR) VMSHIM_KUBE_REQUIRED=1
# The reliability suite: churn, faults, bad input, security. `make test`
# runs it too, with 20 churn cycles; VMSHIM_CHURN=200 is the full size.
VMSHIM_CHURN ?= 20
# The burst sizes of make test-reliability; make test runs 10 alone.
VMSHIM_KUBE_BURST ?= 10,20,30
# How long make test-reliability's soak runs; make test runs one round.
VMSHIM_KUBE_SOAK ?= 1h
RELIABILITY := ^(TestChurn|TestFault.*|TestBadInput.*|TestBadImages.*|TestSecurity.*|TestQEMUKilled|TestShimKilled|TestCRIQEMUKilled|TestCRIShimKilled|TestCRIContainerdRestart)$$

integration: kube guest cloud-guest uefi-guest ## run the integration tests against a real containerd, QEMU and guests
	@SECONDS=0; status=0; \
	$(IT_ENV) VMSHIM_GUEST_TEST=1 VMSHIM_GUEST_DIR=$(GUEST_DIR) \
		$(GO) test -count=1 -timeout 60m -v ./integration/... || status=$$?; \
	echo "integration: took $$SECONDS s"; exit $$status

test-reliability: setup kube guest cloud-guest ## churn, faults, bad input and security (VMSHIM_CHURN=200 for the full churn), bursts of 10, 20 and 30 VM pods through the kubelet, then an hour's soak of every kind of pod (VMSHIM_KUBE_SOAK)
	$(IT_ENV) VMSHIM_CHURN=$(VMSHIM_CHURN) $(GO) test -count=1 -timeout 90m -v -run '$(RELIABILITY)' ./integration/
	$(IT_ENV) VMSHIM_KUBE_BURST=$(VMSHIM_KUBE_BURST) $(GO) test -count=1 -timeout 90m -v -run '^TestKube$$/^Burst$$' ./integration/
	$(IT_ENV) VMSHIM_KUBE_SOAK=$(VMSHIM_KUBE_SOAK) $(GO) test -count=1 -timeout 150m -v -run '^TestKube$$/^Soak$$' ./integration/

# The cgroup v2 + systemd node test: the node image (integration/guest/
# node.sh, cached by a stamp), then the node run (integration/node), each
# with its time.
.PHONY: test-cgroupv2
test-cgroupv2: guest ## boot a cgroup v2 + systemd node VM; check QEMU's cgroups, limits and OOM events under both drivers
	integration/guest/node.sh $(GUEST_DIR)
	@SECONDS=0; status=0; \
	VMSHIM_NODE=1 VMSHIM_BIN=$(BIN) VMSHIM_CONTAINERD=$(CONTAINERD_DIR) VMSHIM_GUEST=$(GUEST_DIR) \
		$(GO) test -count=1 -timeout 30m -v ./integration/node/ || status=$$?; \
	echo "test-cgroupv2: test run took $$SECONDS s"; exit $$status

bench: setup kube guest cloud-guest ## measure start latency, memory, density, teardown, boots at once with pacing off and on, suspend and resume, memory given back and KSM, bursts through the kubelet (table; JSON and SVG in _output/bench; VMSHIM_BENCH_ONLY=suspend runs one section)
	$(IT_ENV) VMSHIM_BENCH=1 VMSHIM_BENCH_OUT=$(OUT)/bench \
		$(GO) test -count=1 -timeout 160m -v -run '^TestBench$$' ./integration/

test: setup unit fuzz integration test-cgroupv2 ## set up and run all tests

demo: guest ## boot a VM image with ctr run through a private containerd, then clean up
	VMSHIM_BIN=$(BIN) VMSHIM_CONTAINERD=$(CONTAINERD_DIR) VMSHIM_GUEST=$(GUEST_DIR) integration/demo.sh

clean: ## remove build output (the cache in $(VMSHIM_CACHE) stays)
	rm -rf $(OUT)
