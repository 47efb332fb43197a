# spark.c — build, test and run.
#
#   make          build/spark (and build/libspark.a, examples)
#   make run      the README's main command on the embedded default model
#   make test     the whole suite, with a normal build and under ASan+UBSan
#
# Sources are found by wildcard: a new .c file under src/ joins the library,
# src/cli/ and src/server/ make the binary, tests/c/test_*.c each become a
# test program run by tests/run.py.

CC      ?= gcc
PYTHON  ?= python3
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation \
           -Iinclude -Isrc -fopenmp -MMD -MP $(SAN) $(EXTRA_CFLAGS)
LDLIBS  += -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread
LDFLAGS += -fopenmp $(SAN)

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/server/*' -not -path 'src/backend/cuda/*' | sort)
BIN_SRC  := $(shell find src/cli src/server -name '*.c' 2>/dev/null | sort)
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(wildcard tests/c/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

# CUDA backend (issue 6): src/backend/cuda/*.cu when nvcc is on PATH (sm_90a
# machine code for Hopper + compute_80 PTX for other GPUs from Ampere on),
# else a stub whose backend reports "built without CUDA". The C side only
# sees src/backend/cuda/cuda_backend.h.
NVCC ?= $(shell command -v nvcc 2>/dev/null)
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
NVCCFLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80
LIB_OBJ  += $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard src/backend/cuda/*.cu))
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
else
LIB_OBJ  += $(BUILD)/obj/src/backend/cuda/cuda_stub.o
endif
BIN_OBJ  := $(BIN_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
TEST_SUPPORT_OBJ := $(TEST_SUPPORT:%.c=$(BUILD)/obj/%.o)
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))

RUN_PROMPT    ?= And God said,
RUN_FLAGS     ?= -n 96 --seed 7

.PHONY: all run test test-fast test-asan deps sysdeps pydeps browserdeps clean gate-teeth
# keep object files that only tests link (make would delete them as intermediates)
.SECONDARY:
all: sysdeps $(BUILD)/spark $(TEST_BIN) $(EXAMPLES)

# (sysdeps first even under make -j: the headers it installs are included here)
$(BUILD)/obj/%.o: %.c | sysdeps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu | sysdeps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Iinclude -Isrc -MMD -MP -c $< -o $@

# the chat page is embedded with .incbin (src/server/page.c)
$(BUILD)/obj/src/server/page.o: src/server/chat_page.html

$(BUILD)/libspark.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/spark: $(BIN_OBJ) $(BUILD)/libspark.a
	$(CC) $(LDFLAGS) -o $@ $(BIN_OBJ) $(BUILD)/libspark.a $(LDLIBS)

$(BUILD)/tests/%: tests/c/%.c $(TEST_SUPPORT_OBJ) $(BUILD)/libspark.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -Itests/c -o $@ $< $(TEST_SUPPORT_OBJ) $(BUILD)/libspark.a $(LDLIBS)

# examples use only the public header, as an embedding program would
$(BUILD)/examples/%: examples/%.c $(BUILD)/libspark.a include/spark.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra $(SAN) -Iinclude -o $@ $< $(BUILD)/libspark.a -fopenmp $(LDLIBS)

# ---- dependencies ---------------------------------------------------------
SYS_HEADERS := /usr/include/pcre2.h /usr/include/cjson/cJSON.h /usr/include/microhttpd.h
SYS_PKGS    := libpcre2-dev libcjson-dev libmicrohttpd-dev
sysdeps:
	@missing=""; for h in $(SYS_HEADERS); do [ -f $$h ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing $(SYS_PKGS) with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYS_PKGS) >/dev/null || exit 1; \
	  else \
	    echo "missing system packages; run: sudo apt-get install -y $(SYS_PKGS)"; exit 1; \
	  fi; \
	fi

pydeps:
	@$(PYTHON) -c "import numpy, gguf, safetensors, tokenizers, pytest, jinja2, pexpect, openai, playwright" 2>/dev/null || \
	  $(PYTHON) -m pip install -q -r tools/requirements.txt

# headless Chromium for the chat page test (skipped without it): installed when root
browserdeps:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium with apt-get (chat page test)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	    echo "chromium could not be installed: the chat page test will be skipped"; \
	fi

deps: sysdeps pydeps browserdeps

# ---- running --------------------------------------------------------------
# spark run without -m uses the embedded default, models/spark-tiny
run: all
	$(BUILD)/spark run -p "$(RUN_PROMPT)" $(RUN_FLAGS)

# ---- tests ----------------------------------------------------------------
# The suite runs twice: optimised, then under AddressSanitizer + UBSan.
test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory all BUILD=build-asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
	$(PYTHON) tests/run.py --build build --build build-asan

test-fast: deps all
	$(PYTHON) tests/run.py --build build

# The quality gate's teeth: build the deliberately broken variants of the
# forward pass (src/engine/mutants.h) and report how far each moves
# spark-tiny's held-out perplexity and greedy text (bench/GATE_TEETH.md).
gate-teeth: all
	@for n in 1 2 3 4; do $(MAKE) --no-print-directory BUILD=build-mutant-$$n EXTRA_CFLAGS=-DSPARK_MUTANT=$$n \
	    build-mutant-$$n/spark >/dev/null || exit 1; done
	$(PYTHON) tools/gate_teeth.py --build $(BUILD) --out bench/GATE_TEETH.md

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
