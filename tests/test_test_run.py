"""A test run writes nothing outside pytest's temporary folders (tests/conftest.py: ``pytest_configure``).

Temporary files go to ``<basetemp>/session-tmp`` and every Hugging Face cache (datasets, evaluate's metrics and
modules, remote-code modules, the hub) to ``<basetemp>/hf-home``, in the test process and in the processes it
starts; the run fails at the end where the package left a temporary folder of its own (``copynce...``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import package_leftovers

CACHES = """
import datasets.config, evaluate.config, huggingface_hub.constants, transformers.utils
print(datasets.config.HF_DATASETS_CACHE, datasets.config.DOWNLOADED_DATASETS_PATH, evaluate.config.HF_METRICS_CACHE,
      evaluate.config.HF_MODULES_CACHE, huggingface_hub.constants.HF_HUB_CACHE, transformers.utils.HF_MODULES_CACHE)
"""


def test_hugging_face_caches_and_temporary_files_stay_in_the_run_folder(tmp_path_factory, tmp_path):
    import datasets

    base = tmp_path_factory.getbasetemp().resolve()
    assert Path(tempfile.gettempdir()).resolve().is_relative_to(base)
    namespace: dict = {}
    exec(CACHES.replace("print(", "found = ("), namespace)
    started = subprocess.run([sys.executable, "-c", CACHES], capture_output=True, text=True, check=True)
    for cache in [*namespace["found"], *started.stdout.split()]:
        assert Path(cache).resolve().is_relative_to(base), f"{cache} is outside the test run's folder {base}"
    # a dataset read from local files is prepared under the run's HF_HOME
    datasets.Dataset.from_dict({"a": [1, 2]}).to_parquet(tmp_path / "d.parquet")
    datasets.load_dataset("parquet", data_files=str(tmp_path / "d.parquet"), split="train")
    assert list((Path(os.environ["HF_HOME"]) / "datasets" / "parquet").iterdir())


def test_the_run_finds_the_package_temporary_folders_left_behind(tmp_path):
    (tmp_path / "session-tmp" / "copynce_space_x1").mkdir(parents=True)
    (tmp_path / "popen-gw1" / "session-tmp" / "copynce-tokens-y2").mkdir(parents=True)
    (tmp_path / "popen-gw1" / "session-tmp" / "gradio").mkdir()
    assert sorted(Path(path).name for path in package_leftovers(tmp_path)) == ["copynce-tokens-y2", "copynce_space_x1"]
