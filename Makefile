# pinrt — build, test and install.
#
# Pinned tool versions. `make deps` is idempotent: it installs only what is
# missing or at another version.
RUNC_VERSION        ?= v1.5.2
CNI_PLUGINS_VERSION ?= v1.9.1
GOLANGCI_VERSION    ?= v2.15.0

PREFIX   ?= /usr/local
BINDIR   ?= $(PREFIX)/bin
CNI_BIN  ?= /opt/cni/bin
GO       ?= go
# pinrt-sigpolicy, the helper that evaluates signature policies, is a
# module of its own, so the daemon does not carry its library
# (go.podman.io/image). That library needs gpgme through cgo unless this
# tag selects its OpenPGP written in Go; only the helper's module needs it.
SIGPOLICY_DIR  := cmd/pinrt-sigpolicy
SIGPOLICY_TAGS := containers_image_openpgp
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin

# VERSION is `git describe` of the tree; version/ turns it into the semver
# kubelet wants (0.2.0, 0.2.1-dev.3+f5dcc36, 0.2.0-dev+f5dcc36.dirty before
# any tag). Empty (no git) falls back on Go's build stamp.
VERSION  ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null)
LDFLAGS  := -X github.com/pinrt/pinrt/version.describe=$(VERSION)

.PHONY: all build test test-unit test-e2e test-node-e2e node-e2e test-vm critest k8snode chaos bench lint docs deps deps-apt deps-bench deps-runc deps-cni deps-lint deps-vm run install clean

all: build

# pinrt is built static, so the pause process of shared-PID pods runs from
# a rootfs holding only this binary.
# pinrt-exec (the streaming exec helper) and pinrt-sigpolicy go beside
# it: the daemon looks for them there first.
build:
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o bin/pinrt ./cmd/pinrt
	CGO_ENABLED=0 $(GO) build -o bin/pinrt-exec ./cmd/pinrt-exec
	cd $(SIGPOLICY_DIR) && CGO_ENABLED=0 $(GO) build -tags $(SIGPOLICY_TAGS) -o $(CURDIR)/bin/pinrt-sigpolicy .
	$(GO) build -o bin/pinrt-bench ./test/bench/cmd/pinrt-bench

# test runs everything: unit tests, the root end-to-end tests on this
# host (critest among them), Kubernetes' node conformance subset on this
# host in both modes (test-node-e2e), then the cgroup and daemon e2e tests
# in a cgroup v2 + systemd VM with each cgroup driver (test-vm; its first
# run builds the VM image).
#
# The Kubernetes binaries of test-node-e2e (about 20 minutes of compiling
# on a cold cache) and the VM image are built in the background from the
# start (hack/prebuild.sh), while the unit and host e2e tests run; each
# suite waits for its build.
#
# A failed go test is run once more (hack/gotest.sh), as node conformance
# retries a failed spec: one that then passes is listed at the end as
# flaked, one that fails again fails the run.
PREBUILD_LOGS ?= /tmp/pinrt-prebuild
GOTEST_FLAKED ?= /tmp/pinrt-flaked.txt
test:
	rm -f $(GOTEST_FLAKED)
	bash hack/prebuild.sh $(PREBUILD_LOGS)
	GOTEST_FLAKED=$(GOTEST_FLAKED) $(MAKE) test-unit test-e2e test-node-e2e test-vm
	@if [ -s $(GOTEST_FLAKED) ]; then echo "=== make test passed; go tests that failed once and passed on a retry:"; cat $(GOTEST_FLAKED); fi

test-unit:
	GO=$(GO) bash hack/gotest.sh -race -count=1 $$($(GO) list ./... | grep -v /test)
	cd $(SIGPOLICY_DIR) && GO=$(GO) bash $(CURDIR)/hack/gotest.sh -race -count=1 -tags $(SIGPOLICY_TAGS) ./...

# test-e2e runs the root end-to-end tests of test/ on this host, among
# them TestCritest: critest, the CRI conformance suite, in full, which
# fails on a failed spec or one that skips itself without an entry in
# test/critest/skip.txt. Its first run builds critest and the stand-in
# images into /var/cache/pinrt-vm (minutes).
test-e2e: build
	GO=$(GO) bash hack/gotest.sh -count=1 -timeout 40m -p 1 ./test/...

# chaos SIGKILLs the daemon CHAOS_ITERATIONS times during concurrent pod
# lifecycles and counts leaks (test/chaos_test.go). `make test` runs a
# short round of it (30 kills); CHAOS_SEED=<n> replays a run.
CHAOS_ITERATIONS ?= 200
chaos: build
	CHAOS_ITERATIONS=$(CHAOS_ITERATIONS) $(GO) test -count=1 -timeout 0 -v -run '^TestChaos$$' ./test/

# test-vm boots a Debian VM (qemu TCG, systemd, cgroup v2) and runs the
# suites of PINRT_VM_SUITES inside it, in this order: pinrt's cgroup and
# daemon e2e tests under each cgroup driver; with PINRT_VM_SUITES naming
# k8s, a Kubernetes node (kubelet, the API server) with pinrt as its
# runtime (test/k8snode) under the systemd driver (PINRT_VM_K8S_DRIVERS);
# critest's cgroup, stats, metrics
# and OOM specs against pinrt run from contrib/pinrt.service under each
# driver. A suite CI's time budget leaves unstarted fails the run. The
# first run builds and caches the VM image, critest, its stand-in images
# and the Kubernetes binary in /var/cache/pinrt-vm (see test/vm/run.sh,
# test/critest, test/standin, test/k8snode/build.sh).
# make test leaves the k8s suite to make k8snode: kubelet with pinrt is
# make test-node-e2e's, on this host, with Kubernetes' own specs, and CI
# has 90 minutes for everything.
PINRT_VM_SUITES ?= e2e critest
test-vm: deps-vm deps-runc deps-cni
	PINRT_VM_SUITES="$(PINRT_VM_SUITES)" bash test/vm/run.sh

# critest runs only the critest suite in the VM, every spec of it (not
# test-vm's subset), under both cgroup drivers (PINRT_VM_DRIVERS picks
# them), and prints critest's summary per driver. make test-e2e runs it
# in full on this host.
critest: deps-vm deps-runc deps-cni
	PINRT_VM_SUITES=critest PINRT_VM_CRITEST_FULL=1 bash test/vm/run.sh

# k8snode runs only the Kubernetes node suite in the VM (kubelet on cgroup
# v2 with systemd), under the systemd driver (PINRT_VM_K8S_DRIVERS="cgroupfs
# systemd" adds the other).
k8snode: deps-vm deps-runc deps-cni
	PINRT_VM_SUITES=k8s bash test/vm/run.sh

# node-e2e runs Kubernetes' own [NodeConformance], SIG Node and SIG CLI
# e2e specs (of the release test/k8snode/build pins) against pinrt on
# this host, on a node of that release's kubelet, API server, scheduler
# and controller manager: once as they are, once with every pod that can
# have one in a user namespace (test/k8snode/node-e2e.sh,
# conformance_test.go). The first run builds the binaries into
# /var/cache/pinrt-vm (about 25 minutes cold).
# PINRT_NODE_E2E_FOCUS narrows the selection, PINRT_NODE_E2E_MODES picks
# the runs.
node-e2e: build deps-runc deps-cni
	bash test/k8snode/node-e2e.sh

# test-node-e2e is the subset of node-e2e that make test (so CI) runs, in
# both modes: pods, container runtime, lifecycle and pre-stop hooks,
# probes, security context, downward API, variable expansion, volumes,
# image volumes, kubelet, sysctls, in-place resize, and kubectl's exec,
# attach, cp, logs, port-forward and debug.
test-node-e2e: build deps-runc deps-cni
	PINRT_NODE_E2E_SUBSET=ci bash test/k8snode/node-e2e.sh

bench: build deps-bench
	bash test/bench/run.sh

# docs regenerates the configuration reference from the conf package
# (hack/configref); make test-unit fails while docs/config.md is stale.
docs:
	$(GO) run ./hack/configref -o docs/config.md

# lint also refuses build outputs in git (hack/check-tracked-files.sh) and
# functions over 80 lines without a "Kept whole:" reason (hack/longfuncs).
lint:
	bash hack/check-tracked-files.sh
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN_DIR)/golangci-lint run ./...
	$(GO) run ./hack/longfuncs
	cd $(SIGPOLICY_DIR) && $(GO) vet -tags $(SIGPOLICY_TAGS) ./... && \
		$(GOBIN_DIR)/golangci-lint run --build-tags $(SIGPOLICY_TAGS) ./...
	$(GO) run ./hack/longfuncs $(SIGPOLICY_DIR)

deps: deps-apt deps-vm deps-runc deps-cni deps-criu deps-lint

# iptables: the default network masquerades and maps ports through it.
# crun: Debian's 1.8.1 lacks idmapped mounts; the tests check the refusal.
# tar, gzip, zstd: tests build image layers with the tools the outside world uses
# (test/standin also fetches .debs with apt-get download and unpacks them with dpkg-deb).
# curl, bzip2, make, gcc: test/standin/busybox.sh builds the node-e2e
# busybox from its source tarball.
deps-apt:
	@need=""; for p in conmon libseccomp-dev busybox-static iproute2 iptables crun tar gzip zstd curl bzip2 make gcc; do \
		dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	if [ -n "$$need" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need; fi

# deps-bench: Debian's containerd, the anchor make bench compares pinrt
# with (test/bench/run.sh starts its own, on its own socket and state
# directories). Only make bench needs it.
deps-bench: deps-apt
	@dpkg -s containerd >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends containerd; }

deps-vm:
	@need=""; for p in qemu-system-x86 debootstrap e2fsprogs; do \
		dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	if [ -n "$$need" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$need; fi

deps-runc: deps-apt
	@if ! runc --version 2>/dev/null | grep -q "runc version $(RUNC_VERSION:v%=%)$$"; then \
		echo "installing runc $(RUNC_VERSION)"; \
		GOBIN=$(BINDIR) CGO_ENABLED=1 $(GO) install -tags seccomp github.com/opencontainers/runc@$(RUNC_VERSION); fi

# deps-criu: CRIU, which runc checkpoints containers with
# (CheckpointContainer); built from Debian's source (hack/criu.sh says why).
deps-criu:
	@sh hack/criu.sh

deps-cni:
	@if [ "$$(cat $(CNI_BIN)/.pinrt-version 2>/dev/null)" != "$(CNI_PLUGINS_VERSION)" ]; then \
		echo "installing CNI plugins $(CNI_PLUGINS_VERSION)"; mkdir -p $(CNI_BIN); \
		GOBIN=$(CNI_BIN) CGO_ENABLED=0 $(GO) install github.com/containernetworking/plugins/plugins/...@$(CNI_PLUGINS_VERSION) && \
		echo $(CNI_PLUGINS_VERSION) > $(CNI_BIN)/.pinrt-version; fi

deps-lint:
	@if ! $(GOBIN_DIR)/golangci-lint version 2>/dev/null | grep -q "$(GOLANGCI_VERSION:v%=%)"; then \
		echo "installing golangci-lint $(GOLANGCI_VERSION)"; \
		$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION); fi

run: build
	./bin/pinrt

install: build
	install -D -m 0755 bin/pinrt $(BINDIR)/pinrt
	install -D -m 0755 bin/pinrt-exec $(BINDIR)/pinrt-exec
	install -D -m 0755 bin/pinrt-sigpolicy $(BINDIR)/pinrt-sigpolicy

clean:
	rm -rf bin bench/out
