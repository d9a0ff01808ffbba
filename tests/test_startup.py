"""Start-up cost and installation metadata: what ``import copynce_hf`` loads, ``copynce --version``, py.typed.

Each check runs in a fresh interpreter, so that nothing this test session imported counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import copynce_hf

REPO_ROOT = Path(__file__).resolve().parents[1]
# The retrieval package itself is light (its names load on first access), and so are the settings the commands build
# their options from (detection.config, deduplication.settings); its search, detection and deduplication are not.
HEAVY = ("torch", "transformers", "accelerate", "faiss", "augly", "datasets", "copynce_hf.retrieval.search.index",
         "copynce_hf.retrieval.detection.pipeline", "copynce_hf.retrieval.detection.candidates",
         "copynce_hf.retrieval.deduplication.collection", "copynce_hf.pipelines",
         "copynce_hf.modeling.modeling_copynce", "copynce_hf.training")


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRANSFORMERS_VERBOSITY": "error"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def loaded(code: str) -> dict:
    """Runs ``code``, then reports which top-level packages of :data:`HEAVY` are imported."""
    output = run_python(code + "\nimport json, sys\nprint('LOADED', json.dumps({name: any(m == name or "
                        "m.startswith(name + '.') for m in sys.modules) for name in " + repr(HEAVY) + "}))")
    return json.loads(output.split("LOADED", 1)[1])


def test_import_copynce_hf_loads_no_heavy_module():
    assert not any(loaded("import copynce_hf").values())
    # The command line builds its parser (``copynce --help``) without them too.
    assert not any(loaded("import copynce_hf.cli\ncopynce_hf.cli.build_parser()").values())


def test_auto_classes_and_pipeline_task_are_registered_on_first_use():
    state = loaded("import copynce_hf\nfrom transformers import AutoConfig, AutoModel\n"
                   "assert AutoConfig.for_model('copynce-matcher').model_type == 'copynce-matcher'\n"
                   "assert AutoConfig.for_model('copynce-vit').model_type == 'copynce-vit'")
    # Registering the models loads the modelling code, not retrieval, pipelines, faiss or augly.
    assert state["transformers"] and state["copynce_hf.modeling.modeling_copynce"]
    assert not any(state[name] for name in ("faiss", "augly", "copynce_hf.retrieval.search.index",
                                             "copynce_hf.retrieval.detection.pipeline", "copynce_hf.pipelines",
                                             "copynce_hf.training"))
    state = loaded("import copynce_hf\nfrom transformers import pipeline\n"
                   "from transformers.pipelines import PIPELINE_REGISTRY\n"
                   "assert 'image-copy-detection' in PIPELINE_REGISTRY.get_supported_tasks()")
    assert state["copynce_hf.pipelines"] and not state["copynce_hf.retrieval.search.index"] and not state["faiss"]
    # transformers imported before copynce_hf: registered at once.
    run_python("from transformers import AutoConfig, pipeline\nimport copynce_hf\n"
               "from transformers.pipelines import PIPELINE_REGISTRY\n"
               "assert AutoConfig.for_model('copynce-descriptor').model_type == 'copynce-descriptor'\n"
               "assert 'image-copy-detection' in PIPELINE_REGISTRY.get_supported_tasks()")
    # A model module imported directly (its import pulls in transformers' Auto classes midway).
    run_python("from copynce_hf.modeling.modeling_copynce import CopyNCEMatcherModel\n"
               "from transformers import AutoConfig\n"
               "assert AutoConfig.for_model('copynce-matcher').model_type == 'copynce-matcher'\n"
               "assert CopyNCEMatcherModel._auto_class == 'AutoModel'")


def test_version_option_and_typed_marker():
    output = run_python("from copynce_hf.cli import main\nmain(['--version'])")
    assert output.strip() == f"copynce {copynce_hf.__version__}"
    assert (REPO_ROOT / "copynce_hf" / "py.typed").is_file()
    assert '"py.typed"' in (REPO_ROOT / "setup.py").read_text()
