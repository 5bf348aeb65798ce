# kvcs developer commands. Every target installs what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench clean

# setup.py builds the compiled q8 kernels: a change to them reinstalls too.
$(STAMP): pyproject.toml setup.py kvcs/kv/_q8.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,zstd]'
	-$(PY) -m pip install -q -e '.[interop]' || echo "moq-ffi not installable here: interop tests will be skipped"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The network suites run twice: on qh3 (the default QUIC library) and on aioquic, so
# both libraries and their mix (tests/relay/test_backends.py) stay tested.
NET_TESTS := tests/session tests/transport tests/relay tests/e2e

test: $(STAMP)
	$(PY) -m ruff check kvcs tests examples bench
	$(PY) -m mypy
	$(PY) -m pytest -q
	KVCS_QUIC_BACKEND=aioquic $(PY) -m pytest -q -m "not interop" $(NET_TESTS)

lint: $(STAMP)
	$(PY) -m ruff check kvcs tests examples bench
	$(PY) -m mypy

# The bench extra (matplotlib, for bench-timeline.png) is the bench's own dependency.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m bench $(BENCH)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis bench-results.json build kvcs/kv/*.so
