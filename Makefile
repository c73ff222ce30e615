# Thin front end over CMake. The commands a newcomer runs:
#   make run    install missing packages, build, run kvxfer-bench (verified)
#   make test   install missing packages, build, run every test (VM included)
BUILD      ?= build
BUILD_TYPE ?= RelWithDebInfo
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build run test test-unit test-asan test-tsan test-fuzz test-bindings test-interop test-vm \
        bench-compare bench-compare-verbs bench-compare-verbs-rails deb rpm wheels test-wheels test-install abi-check option-docs install clean

all: build

deps:
	@scripts/deps.sh all

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: deps build
	$(BUILD)/kvxfer-bench --cold 256M

# Every test: unit + conformance + fingerprint corpus + fuzz replay, then the
# suite under ASan+UBSan, the threaded tests under TSan, the fuzzers for a
# bounded time, and the verbs suite inside the Soft-RoCE VM.
test: deps build
	scripts/test.sh all

test-unit: deps build
	scripts/test.sh unit

test-asan: deps
	scripts/test.sh asan

test-tsan: deps
	scripts/test.sh tsan

test-fuzz: deps
	scripts/test.sh fuzz

test-bindings: deps build
	scripts/test.sh bindings

# needs the bindings built (test-bindings)
test-interop: deps build
	scripts/test.sh interop

test-vm: deps build
	scripts/test.sh vm

# A self-contained wheel (libkvxfer.so.0 inside, RUNPATH $$ORIGIN) per CPython
# 3.9-3.13 found (pyenv's or /usr/bin's): build-wheel/wheels/*.whl, from a
# Release build in build-wheel. test-wheels: each in a fresh venv.
wheels:
	bindings/python/build-wheels.sh build-wheel

test-wheels: deps
	bindings/python/test-wheels.sh build-wheel

# Packages land in build-deb/packages and build-rpm/packages.
deb: deps
	packaging/build-deb.sh build-deb

rpm: deps
	packaging/build-rpm.sh build-rpm

test-install: deps
	packaging/test-install.sh build-deb
	KVX_PKG_FORMAT=rpm packaging/test-install.sh build-rpm

abi-check: deps build
	packaging/abi-check.sh $(BUILD)

# README.md's option table and kvx_options_set(3) from the option tables in src/
option-docs: build
	scripts/gen-option-docs.py --tool $(BUILD)/kvxfer-options

# packaging/debian/changelog and packaging/rpm/changelog from NEWS.md
.PHONY: changelogs
changelogs:
	scripts/gen-changelogs.sh

bench-compare: deps build
	bench/compare-tcp.sh

# ib_write_bw vs kvxfer-bench on the VM's Soft-RoCE device, one VM boot
bench-compare-verbs: deps build
	bench/compare-verbs.sh $(BUILD)

# two rails (rxe0 + rxe1): kvxfer on both and on one, against two
# concurrent ib_write_bw runs, one per device, summed
bench-compare-verbs-rails: deps build
	RAILS=2 IB_CONFIGS="-R|-R -q 2" KVX_VARIANTS="|--option verbs.devices=rxe0" bench/compare-verbs.sh $(BUILD)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-deb build-rpm build-noverbs build-wheel
