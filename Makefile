# Short commands over CMake. `make test` is all a fresh machine needs.
#   make            build (RelWithDebInfo) into build/
#   make run        the main program, weft-images, on a generated sample set
#                   (builds weft-images only; host-only in build-host/ without a GPU)
#   make test       build and run the host test suite under CTest
#   make check-asan the same suite under AddressSanitizer + UBSan
#   make check-tsan the same suite under ThreadSanitizer (less the MPI tests)
#   make bench      build optimized and run the CPU benchmarks
#   make gpu-test   build, then run the GPU test suite (ctest -L gpu: tests/*/test_*_gpu.c);
#                   fails when every test was skipped (no GPU)
#   make bench-wake  how late a task awaiting MPI resumes, against MPI_Wait
#                   (MPI needed; as root, OMPI_ALLOW_RUN_AS_ROOT=1 and
#                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
#   make gpu-bench  build optimized and run the GPU benchmarks (nvcc and a GPU)
#   make install    build, then install into PREFIX (default /usr/local):
#                   libraries, headers, CMake package, pkg-config file
#   make check-install  install into a temporary prefix and build and run
#                   examples/consumer, kernel and guide against it (CMake and pkg-config)
#   make images-bench  weft-images against a thread pool on the GPU, 1 to 16
#                   workers; with RECORD=1 it redraws docs/images-scaling.svg
#   make gpu-bench-ops  the operators against PyTorch eager and torch.compile
#   make gpu-bench-matmul  weft_matmul against torch.matmul and torch eager,
#                   and weft_matmul_sparse against torch's cuSPARSELt product
#   make gpu-bench-moe  the MoE router and grouped matmul against torch eager,
#                   torch._grouped_mm and a loop of torch.matmul
#   make gpu-bench-conv  weft_conv2d (BatchNorm folded, bias+ReLU fused) against
#                   PyTorch eager conv->bn->relu and torch with the BN folded
#   make gpu-bench-decode  weft_attention_decode over a paged KV cache against
#                   torch's scaled_dot_product_attention and a copy's ceiling
#   make gpu-bench-sample  weft_sample and weft_penalize against PyTorch's
#                   sampling (argmax, sort and top-p, top-k, multinomial)
#   make gpu-bench-attention  weft_attention against PyTorch's
#                   scaled_dot_product_attention (flash, cuDNN, efficient)
#   make gpu-bench-llm  weft-llm (bench, speculative decoding, serve under
#                   loadgen) on random 1B and 8B models against transformers
# A benchmark writes its rows (JSON lines) under build-release/bench/ and
# changes nothing tracked; RECORD=1 (make bench RECORD=1) appends them to
# bench/results.jsonl and regenerates bench/RESULTS.md from it.
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
PYTHON ?= python3
CMAKE  ?= cmake
CTEST  ?= ctest

.PHONY: all deps test check-asan check-tsan bench gpu-bench clean

# The benchmarks' build (build-release/): optimized, no tests, and the modes
# that exist only to be measured (WEFT_MEASURE_MODES: the CUDA completion by
# callbacks, WEFT_CUDA_COMPLETION=callback), which the shipped library lacks.
BENCH_CONFIG = -DCMAKE_BUILD_TYPE=Release -DWEFT_TESTS=OFF -DWEFT_MEASURE_MODES=ON

all: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
	$(CMAKE) --build build -j $(JOBS)

# The main program: weft-images on a generated sample set (3000 images with
# planted near-duplicates, made once), scored against its ground truth.
# It builds weft-images and its sample generator only, none of the tests or
# benchmarks. With a GPU that is in build/, configured as `make` does, CUDA
# kernels included: weft's operators and weft-images' stages, which take
# minutes of nvcc on a small machine (said before it starts). Without a GPU
# weft-images would run on the host backend anyway, so it is built without
# the CUDA backend in build-host/ (WEFT_CUDA=OFF): the same program on the
# same library code, less the CUDA backend and kernels it could not use, in
# under a minute. RUN_GPU=1 (or 0) overrides what was found. It installs
# only the packages weft-images needs (scripts/install-deps run).
RUN_GPU ?= $(shell { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; } || [ -e /dev/nvidia0 ] && echo 1 || echo 0)
ifeq ($(RUN_GPU),1)
RUN_BUILD  = build
RUN_CONFIG = -DCMAKE_BUILD_TYPE=RelWithDebInfo
RUN_SAYS   = building weft-images in $(RUN_BUILD)/ for the GPU, with the CUDA kernels (weft's operators, weft-images' stages): about 3 minutes of nvcc on 2 cores
else
RUN_BUILD  = build-host
RUN_CONFIG = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_CUDA=OFF -DWEFT_TESTS=OFF -DWEFT_BENCH=OFF
RUN_SAYS   = no GPU found: building weft-images in $(RUN_BUILD)/ for the host backend only (RUN_GPU=1 builds the CUDA one)
endif
RUN_DIR ?= $(RUN_BUILD)/run
RUN_BIN  = $(RUN_BUILD)/apps/weft-images
.PHONY: run
run:
	@scripts/install-deps run
	@echo "make run: $(RUN_SAYS)"
	$(CMAKE) -S . -B $(RUN_BUILD) $(RUN_CONFIG)
	@! grep -qs '^STB_[A-Z_]*:[A-Z]*=.*NOTFOUND' $(RUN_BUILD)/CMakeCache.txt || \
	  { echo "make run: weft-images was not built: it needs libstb-dev (scripts/install-deps)" >&2; exit 1; }
	$(CMAKE) --build $(RUN_BUILD) -j $(JOBS) --target weft-images weft-images-sample
	@test -s $(RUN_DIR)/truth.txt || \
	  $(RUN_BIN)/weft-images-sample -n 3000 -t $(RUN_DIR)/truth.txt $(RUN_DIR)/images
	$(RUN_BIN)/weft-images --truth $(RUN_DIR)/truth.txt \
	  -o $(RUN_DIR)/features.jsonl $(RUN_DIR)/images
	@echo "make run: one JSON line per image and per group in $(RUN_DIR)/features.jsonl;" \
	  "the program is $(RUN_BIN)/weft-images"

# Installs missing Debian/Ubuntu packages; does nothing when all are there.
deps:
	@scripts/install-deps

test: all
	$(CTEST) --test-dir build --output-on-failure -j $(JOBS)

check-asan: deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=address -DWEFT_BENCH=OFF
	$(CMAKE) --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(CTEST) --test-dir build-asan --output-on-failure -j $(JOBS)

# clang's TSan switches fibers in under a microsecond; gcc 12's takes tens.
# tests/tsan.supp: what TSan cannot see of OpenBLAS's threads.
# A build-tsan/ configured with another compiler is started afresh.
# The MPI tests (label mpi) are left out here: libmpi is not instrumented,
# so TSan cannot see the synchronisation inside it - a receive buffer that
# MPI's progress, run by one task, fills and the receiving task reads once
# MPI says it is complete reads as a race - nor would its own reports about
# Open MPI's locks be ours. check-asan runs them (without their leak check:
# CMakeLists.txt says why).
check-tsan: deps
	@grep -qs 'CMAKE_C_COMPILER:.*clang' build-tsan/CMakeCache.txt || rm -rf build-tsan
	CC=clang $(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_SANITIZE=thread -DWEFT_BENCH=OFF
	$(CMAKE) --build build-tsan -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp \
	  $(CTEST) --test-dir build-tsan --output-on-failure -j $(JOBS) -LE mpi

# record ROWS: with RECORD=1, the run's rows into the record; else where
# they are.
RECORD ?=
ROWS_DIR = build-release/bench
record = $(if $(filter 1 yes,$(RECORD)),$(PYTHON) bench/results.py record $(1),\
  @echo "make: this run's rows are in $(1); RECORD=1 records them (bench/results.jsonl, bench/RESULTS.md)")

bench: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS)
	build-release/bench/bench_core --rows $(ROWS_DIR)/bench_core.rows.jsonl
	$(call record,$(ROWS_DIR)/bench_core.rows.jsonl)

# A task's wake-up after waits of 50 us to 10 ms, two ranks on this machine.
MPIEXEC ?= mpiexec --oversubscribe
.PHONY: bench-wake
bench-wake: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target bench_wake
	$(MPIEXEC) -n 2 build-release/bench/bench_wake

# weft and its raw-CUDA peers in one run.
gpu-bench: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS)
	scripts/gpu-bench --rows $(ROWS_DIR)/gpu-bench.rows.jsonl
	$(call record,$(ROWS_DIR)/gpu-bench.rows.jsonl)

# weft-images against its thread-pool peer on the GPU.
.PHONY: images-bench
images-bench: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS)
	scripts/images-bench --rows $(ROWS_DIR)/images-bench.rows.jsonl
	$(call record,$(ROWS_DIR)/images-bench.rows.jsonl)
	$(if $(filter 1 yes,$(RECORD)),$(PYTHON) bench/images_figure.py)

# weft's operators, PyTorch eager and torch.compile on the same tensors in
# one process (PyTorch and a GPU needed).
# BENCH_OPS_ARGS passes options: bench/ops/bench_ops.py --help.
.PHONY: gpu-bench-moe
gpu-bench-moe: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared
	$(PYTHON) bench/moe/bench_moe.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/moe.rows.jsonl $(BENCH_MOE_ARGS)
	$(call record,$(ROWS_DIR)/moe.rows.jsonl)

.PHONY: gpu-bench-matmul
gpu-bench-matmul: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared matmul_overhead
	$(PYTHON) bench/matmul/bench_matmul.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/matmul.rows.jsonl $(BENCH_MATMUL_ARGS)
	$(call record,$(ROWS_DIR)/matmul.rows.jsonl)

# weft_conv2d against PyTorch at ResNet-50's shapes (PyTorch, cuDNN and a
# GPU needed). BENCH_CONV_ARGS passes options: bench/conv/bench_conv.py --help.
.PHONY: gpu-bench-conv
gpu-bench-conv: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared
	$(PYTHON) bench/conv/bench_conv.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/conv.rows.jsonl $(BENCH_CONV_ARGS)
	$(call record,$(ROWS_DIR)/conv.rows.jsonl)

# weft_attention against torch's scaled_dot_product_attention backends
# (PyTorch and a GPU needed). BENCH_ATTENTION_ARGS passes options:
# bench/attention/bench_attention.py --help.
.PHONY: gpu-bench-attention
gpu-bench-attention: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared
	$(PYTHON) bench/attention/bench_attention.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/attention.rows.jsonl $(BENCH_ATTENTION_ARGS)
	$(call record,$(ROWS_DIR)/attention.rows.jsonl)

# weft_attention_decode over a paged KV cache against PyTorch's SDPA (PyTorch
# and a GPU needed). BENCH_DECODE_ARGS passes options: bench/attention/bench_decode.py --help.
.PHONY: gpu-bench-decode
gpu-bench-decode: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared
	$(PYTHON) bench/attention/bench_decode.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/decode.rows.jsonl $(BENCH_DECODE_ARGS)
	$(call record,$(ROWS_DIR)/decode.rows.jsonl)

.PHONY: gpu-bench-sample
gpu-bench-sample: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_shared
	$(PYTHON) bench/sample/bench_sample.py --lib build-release/libweft.so \
	  --rows $(ROWS_DIR)/sample.rows.jsonl $(BENCH_SAMPLE_ARGS)
	$(call record,$(ROWS_DIR)/sample.rows.jsonl)

.PHONY: gpu-bench-ops
gpu-bench-ops: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft_ops_bench
	$(PYTHON) bench/ops/bench_ops.py --lib build-release/bench/ops/libweft_ops_bench.so \
	  --rows $(ROWS_DIR)/ops.rows.jsonl $(BENCH_OPS_ARGS)
	$(call record,$(ROWS_DIR)/ops.rows.jsonl)

# weft-llm on random Llama-shaped models against the targets of its issues
# and against transformers' generate (PyTorch, transformers and a GPU
# needed; about 8 minutes, and 19 GB under /tmp for the models, which later
# runs reuse). LLM_OUT gets the logs, summary.md and data.json;
# BENCH_LLM_ARGS passes options: bench/llm/bench_llm.py --help.
LLM_OUT ?= $(ROWS_DIR)/llm
.PHONY: gpu-bench-llm
gpu-bench-llm: deps
	$(CMAKE) -S . -B build-release $(BENCH_CONFIG)
	$(CMAKE) --build build-release -j $(JOBS) --target weft-llm
	$(PYTHON) bench/llm/bench_llm.py --weft-llm build-release/apps/weft-llm/weft-llm \
	  --out $(LLM_OUT) --rows $(ROWS_DIR)/llm.rows.jsonl $(BENCH_LLM_ARGS)
	$(call record,$(ROWS_DIR)/llm.rows.jsonl)

# The GPU suite (CTest label `gpu`), through scripts/gpu-test: it counts the
# tests skipped for want of a GPU and fails when none ran, where CTest alone
# says "100% tests passed". scripts/gpu-check runs it under compute-sanitizer.
.PHONY: gpu-test
gpu-test: all
	scripts/gpu-test build

# Installing: the prefix may be chosen here, after configuring.
PREFIX ?= /usr/local
.PHONY: install check-install
install: all
	$(CMAKE) --install build --prefix $(PREFIX)

check-install: all
	scripts/check-install build

clean:
	rm -rf build build-host build-asan build-tsan build-release
