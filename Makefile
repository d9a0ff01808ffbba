# Installs what is missing, then runs. The CPU wheel of torch goes first so that
# nothing later pulls a CUDA build (see DEVELOPERS.md).
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
STAMP := .make-installed

.PHONY: install test lint train bench demo clean

$(STAMP): setup.py
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==$(TORCH_VERSION)
	$(PYTHON) -m pip install -q "setuptools>=70.1" wheel cython  # cython: pdqhash builds from source without isolation
	$(PYTHON) -m pip install -q --no-build-isolation -e ".[dev,bench,train]"
	@touch $(STAMP)

install: $(STAMP)

test: install
	$(PYTHON) -m ruff check copynce_hf scripts tests benchmarks
	$(PYTHON) -m pytest -q -x --timeout=900 tests

lint: install
	$(PYTHON) -m ruff check copynce_hf scripts tests benchmarks

# The training loop on its embedded default: a tiny CopyNCE descriptor trained on the bundled images.
train: install
	accelerate launch scripts/train.py

# The main job: copy detection on the bundled images with the embedded models (no network, no data);
# prints the results table and the path of the HTML report (outputs/demo/report.html).
demo: install
	$(PYTHON) -m copynce_hf.demo

bench: install
	$(PYTHON) scripts/bench_pixtrace.py
	$(PYTHON) scripts/bench_dataloader.py

clean:
	rm -f $(STAMP)
