# Modelyard: `make run` serves the embedded default; `make test` runs every check CI runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The ONNX Runtime wheel: cpu (the default) or gpu (`make install-gpu`); a venv made for gpu stays gpu
# until `make install ORT=cpu`. Both wheels write the same `onnxruntime` package, so only one is ever installed.
ORT ?= $(if $(wildcard $(VENV)/.installed-gpu),gpu,cpu)
GPU_CHECK_VENV := build/gpu-wheel-check
LOCK := requirements
TEST_DEPS := $(VENV)/.installed-test-deps
DOCS_DEPS := $(VENV)/.installed-docs-deps
# The OpenID provider the sign-in tests start (node oidc-provider, tests/oidc_provider/), from its npm lock.
OIDC_PROVIDER_DEPS := tests/oidc_provider/node_modules/.installed
UV_COMPILE := --universal --python-version 3.11 --generate-hashes --quiet --custom-compile-command 'make lock'
# `make run PORT=8100`: the HTTP port; gRPC takes the next one unless GRPC_PORT (or MODELYARD_GRPC_PORT) says.
PORT ?= 8000
GRPC_PORT ?=

.PHONY: install install-gpu lock run test checks migrations suite lint typecheck services bench bench-install bench-serve check-gpu-wheel docs docs-build clean

install: $(VENV)/.installed-$(ORT)

install-gpu:
	$(MAKE) install ORT=gpu

# The lock (requirements/*.txt, hashes for every file) is what gets installed; pyproject.toml only says
# what the lock may choose. The project itself goes in editable, without dependencies of its own.
$(VENV)/.installed-%: pyproject.toml $(LOCK)/%.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# switching wheels: the other one overwrote shared files, so remove both and install the one wanted afresh
	if $(BIN)/pip show --quiet $(if $(filter gpu,$*),onnxruntime,onnxruntime-gpu) >/dev/null 2>&1; then \
		$(BIN)/pip uninstall --quiet -y onnxruntime onnxruntime-gpu; fi
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)/$*.txt
	$(BIN)/pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed $(VENV)/.installed-* $(TEST_DEPS) $(DOCS_DEPS)
	touch $@

# What only the tests need (pytest, Playwright, moto, tritonclient, the linters), from its own lock.
$(TEST_DEPS): $(VENV)/.installed-$(ORT) $(LOCK)/test.txt
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)/test.txt
	touch $@

$(OIDC_PROVIDER_DEPS): tests/oidc_provider/package.json tests/oidc_provider/package-lock.json
	npm ci --prefix tests/oidc_provider --no-audit --no-fund --loglevel=error
	touch $@

# MkDocs and the Material theme for the documentation site (docs/, mkdocs.yml), from their own lock.
$(DOCS_DEPS): $(VENV)/.installed-$(ORT) $(LOCK)/docs.txt
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)/docs.txt
	touch $@

# Refresh the lock after changing pyproject.toml's dependencies (needs the package index). uv resolves for
# every platform at once (--universal); the GPU, test, bench and docs locks keep the CPU lock's versions.
lock: $(VENV)/.installed-$(ORT)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml $(UV_COMPILE) --extra cpu -o $(LOCK)/cpu.txt
	$(BIN)/uv pip compile pyproject.toml $(UV_COMPILE) --extra gpu -c $(LOCK)/cpu.txt -o $(LOCK)/gpu.txt
	$(BIN)/uv pip compile pyproject.toml $(UV_COMPILE) --extra test -c $(LOCK)/cpu.txt -o $(LOCK)/test.txt
	$(BIN)/uv pip compile pyproject.toml $(UV_COMPILE) --extra bench -c $(LOCK)/cpu.txt -o $(LOCK)/bench.txt
	$(BIN)/uv pip compile pyproject.toml $(UV_COMPILE) --extra docs -c $(LOCK)/cpu.txt -o $(LOCK)/docs.txt

run: install
	$(BIN)/modelyard serve --port $(PORT)$(if $(GRPC_PORT), --grpc-port $(GRPC_PORT))

services:
	bash scripts/services.sh

lint: $(TEST_DEPS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_DEPS)
	$(BIN)/mypy modelyard onnxkit registry storage inference bench tests

# The GPU variant in a fresh venv (no CUDA libraries, no GPU): exactly one ONNX Runtime, CUDA among its
# providers, the fallback says why; then the CPU wheel over it, which start-up must refuse. pip's cache
# keeps the 250 MB onnxruntime-gpu wheel between runs.
check-gpu-wheel:
	rm -rf $(GPU_CHECK_VENV)
	$(PYTHON) -m venv $(GPU_CHECK_VENV)
	$(GPU_CHECK_VENV)/bin/pip install --quiet --require-hashes -r $(LOCK)/gpu.txt
	$(GPU_CHECK_VENV)/bin/pip install --quiet --no-deps .
	$(GPU_CHECK_VENV)/bin/python scripts/check_gpu_wheel.py
	$(GPU_CHECK_VENV)/bin/pip install --quiet --no-deps "$$(grep -o '^onnxruntime==[^ ]*' $(LOCK)/cpu.txt)"
	$(GPU_CHECK_VENV)/bin/python scripts/check_gpu_wheel.py --expect-refusal
	rm -rf $(GPU_CHECK_VENV)

# Everything CI checks: the static checks beside the suite (two jobs), each job's output kept together.
test: $(TEST_DEPS) services
	$(MAKE) --no-print-directory -j2 --output-sync=target checks suite

checks: lint typecheck docs-build migrations

migrations: $(TEST_DEPS)
	$(BIN)/python manage.py makemigrations --check --dry-run

# The whole suite, slow tests included and scheduled first, over TEST_WORKERS processes; tests that share a
# broker or network namespaces keep to one worker (tests/support/scheduling.py). With COVERAGE=on (CI's
# default: CI=true) line coverage of the project, in the tests and every process they start, must reach 90%
# (pyproject.toml: [tool.coverage]); it costs about 40% more CPU, so a local `make test` leaves it out.
TEST_WORKERS ?= 4
COVERAGE ?= $(if $(filter true,$(CI)),on,off)
suite: $(TEST_DEPS) $(OIDC_PROVIDER_DEPS) services
	rm -rf build/coverage && mkdir -p build/coverage
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "slow or not slow" --durations=20 \
		$(if $(filter on,$(COVERAGE)),--cov --cov-report=term --cov-fail-under=90)

bench: $(TEST_DEPS) services
	$(BIN)/python bench/upload.py

# bench/serve.py's extras: FastAPI for the naive baseline, py-spy to profile; wrk and h2load generate the load.
bench-install: $(TEST_DEPS)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)/bench.txt
	@command -v wrk >/dev/null && command -v h2load >/dev/null || echo "also: apt-get install -y wrk nghttp2-client"

# The serving goals, three rounds: served/raw batch-32 and served/naive at 64 clients, single-client p50
# overhead; MiniLM with instances 2 (two CPU lanes).
bench-serve: bench-install
	$(BIN)/python bench/serve.py --clients 1,64 --rounds 3 --instances 2 --max-batch-size 16

# The documentation site (docs/, mkdocs.yml): `make docs` serves it with live reload on http://127.0.0.1:8800
# (`make docs DOCS_PORT=...`), beside a server on 8000; `make docs-build` builds it into build/site as CI does,
# where any warning (a link to a missing page or heading, a page left out of the nav) fails it.
DOCS_PORT ?= 8800
docs: $(DOCS_DEPS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:$(DOCS_PORT)

docs-build: $(DOCS_DEPS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d build/site

clean:
	rm -rf $(VENV) .modelyard .pytest_cache .mypy_cache .ruff_cache .hypothesis
