# The two set-up commands of the README: `make run` and `make test`. Each installs what is
# missing, configures and builds (ccache, -j2), then runs or tests.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
TROUPE := $(BUILD)/apps/troupe

.PHONY: run test deps configure build bench asan tsan clean

run: build
	scripts/run-demo.sh $(TROUPE)

# Skipped tests (data absent from a user's clone, no GPU) are listed with their reasons, then
# failed ones with the lines where they failed (last, where a log's tail shows them).
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS); status=$$?; \
	  scripts/skipped-tests.sh $(BUILD); scripts/failed-tests.sh $(BUILD); exit $$status

deps:
	@scripts/install-deps.sh

configure: deps
	@[ -f $(BUILD)/build.ninja ] || cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

bench: build
	$(BUILD)/bench/bench_generate

# Sanitizer builds live in their own build trees: `make asan` / `make tsan` build and test there.
asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DTROUPE_ASAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"

# TSan needs a TSan-built CAF core (Debian's is not instrumented: every message hand-off would
# look like a race); scripts/build-caf-tsan.sh builds one from Debian's CAF source, once. UCX's
# memory hooks crash under TSan: they are switched off (docs/transport.md).
tsan:
	scripts/build-caf-tsan.sh build-caf-tsan
	$(MAKE) build BUILD=build-tsan CMAKE_FLAGS="-DTROUPE_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"
	UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no TSAN_OPTIONS=suppressions=$(CURDIR)/tests/tsan.supp \
	  LD_LIBRARY_PATH=$(CURDIR)/build-caf-tsan/lib ctest --test-dir build-tsan --output-on-failure -j $(JOBS)

clean:
	rm -rf build build-asan build-tsan build-caf-tsan
