# PagedWeight: the two commands are `make serve` and `make test` (see README).
# Both create .venv/ and install what is missing first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of this torch release is on the CI machines' disk; on a GPU
# machine the same pin resolves to the CUDA build.
TORCH_PIN := torch==2.13.0
MODEL ?= models/pw-moe-tiny
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core; work-stealing, since a few
# interpreter tests take a minute and most a second.
PYTEST_WORKERS ?= auto

.PHONY: serve test install proto clean

serve: install proto
	$(BIN)/python -m launcher --model $(MODEL) $(SERVE_ARGS)

# pytest exits 5 when it collected no tests; make treats that as a failure.
test: install proto
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]" --config-settings editable_mode=compat
	touch $(STAMP)

proto: install
	$(BIN)/python tools/gen_proto.py

clean:
	rm -rf $(VENV) pagedweight .pytest_cache
