# Short commands over CMake. `make test` is all a fresh machine needs.
#   make            build (RelWithDebInfo) into build/
#   make test       build and run the host test suite under CTest
#   make check-asan the same suite under AddressSanitizer + UBSan
#   make check-tsan the same suite under ThreadSanitizer
#   make bench      build optimized and run the CPU benchmarks
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE  ?= cmake
CTEST  ?= ctest

.PHONY: all deps test check-asan check-tsan bench clean

all: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
	$(CMAKE) --build build -j $(JOBS)

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

check-tsan: deps
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_SANITIZE=thread -DWEFT_BENCH=OFF
	$(CMAKE) --build build-tsan -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  $(CTEST) --test-dir build-tsan --output-on-failure -j $(JOBS)

bench: deps
	$(CMAKE) -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DWEFT_TESTS=OFF
	$(CMAKE) --build build-release -j $(JOBS)
	build-release/bench/bench_core

clean:
	rm -rf build build-asan build-tsan build-release
