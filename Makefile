# Entry points for people and CI. On a fresh Debian 12 machine, `make demo` and `make test` do all
# the set-up: `deps` installs the Debian packages the build and the tests need (as root, or through
# sudo when it exists), `build` configures and builds into $(BUILD_DIR).

SHELL := /bin/bash
.DEFAULT_GOAL := build

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)

# Exactly the Debian 12 packages the build and the tests need. Later components append theirs
# (UCX, prometheus-cpp) here.
DEB_PACKAGES := cmake make g++ pkg-config libabsl-dev libprotobuf-dev protobuf-compiler \
	libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libucx-dev ucx-utils \
	iproute2 prometheus-cpp-dev prometheus python3 python3-torch python3-protobuf \
	clang-14 libclang-rt-14-dev

# Empty when running as root; "sudo" when not root and sudo exists (apt-get then fails with its own
# message when neither holds).
SUDO := $(shell if [ "$$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then echo sudo; fi)

WSYNC := $(BUILD_DIR)/integration/cli/wsync
PLANNER_BENCH := $(BUILD_DIR)/tests/bench/planner_bench

# Test labels `make test` leaves out: slow (long-running) and gpu (needs an NVIDIA GPU).
EXCLUDED_LABELS := slow|gpu

.PHONY: deps build test demo bench format clean

# Idempotent: apt is not touched when every package is installed; otherwise the package lists are
# updated once and only the missing packages are installed.
deps:
	@missing=""; \
	for package in $(DEB_PACKAGES); do \
	  status=$$(dpkg-query -W -f='$${db:Status-Status}' "$$package" 2>/dev/null || true); \
	  if [ "$$status" != "installed" ]; then missing="$$missing $$package"; fi; \
	done; \
	if [ -z "$$missing" ]; then \
	  echo "deps: all $(words $(DEB_PACKAGES)) packages are installed"; \
	else \
	  echo "deps: installing$$missing"; \
	  $(SUDO) apt-get update && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD_DIR) -j$(JOBS)

# Runs every test except those labelled slow or gpu; each test's timeout comes from CMake
# (wsync_cc_test). GPU tests are never skipped silently: with a GPU present they run next, without
# one the last line says they were not run and why.
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -LE '$(EXCLUDED_LABELS)'
	@gpu_tests=$$(ctest --test-dir $(BUILD_DIR) -N -L gpu | sed -n 's/^Total Tests: //p'); \
	gpu_tests=$${gpu_tests:-0}; \
	if ! [ -e /dev/nvidia0 ] && ! nvidia-smi -L >/dev/null 2>&1; then \
	  echo "test: $$gpu_tests gpu-labelled tests were not run: no GPU" \
	       "(nvidia-smi lists none and /dev/nvidia0 does not exist)"; \
	elif [ "$$gpu_tests" -eq 0 ]; then \
	  echo "test: a GPU is present but no test is labelled gpu yet"; \
	else \
	  ctest --test-dir $(BUILD_DIR) --output-on-failure -L gpu -LE slow; \
	fi

# The main job on the embedded default: 2 trainers (megatron tp=2) and 2 rollouts (vllm tp=2) of
# qwen2.5-0.5b load libwsync.so with dlopen and run 5 RL steps over UCX shared memory; every rollout
# verifies every byte of every version. `wsync demo --help` lists the options.
demo: build
	$(WSYNC) demo

bench: build
	$(PLANNER_BENCH)

# Formats the C++ files git tracks or would track (ignored paths such as build trees excluded).
format:
	git ls-files -z --cached --others --exclude-standard -- '*.h' '*.cc' \
	  | xargs -0 -r clang-format -i

clean:
	rm -rf $(BUILD_DIR)
