"""Every recipe preset draws exactly the edits it drew when this fixture was recorded.

The fixture ``fixtures/preset_draws.json`` holds, per preset, the JSON edit lists drawn on fixed
seeds and image sizes (no pixel work). Refactoring the recipe types must leave it unchanged; a
deliberate change of a preset's draws regenerates it with ``python tests/test_preset_draws.py``.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "preset_draws.json"
SIZES = ((480, 640), (224, 224), (333, 500), (900, 300))
SEEDS = range(6)


def _editor_draws(recipe, output_size) -> list:
    from copynce_hf.pixtrace import CopyEditor

    drawn = []
    for size in SIZES:
        editor = CopyEditor(seed=7, recipe=recipe, output_size=output_size)
        drawn += [[edit.to_dict() for edit in editor.draw(size, seed=k)] for k in SEEDS]  # per-call seeds
        drawn += [[edit.to_dict() for edit in editor.draw(size)] for _ in SEEDS]  # the editor's own stream
    return drawn


def _query_draws(recipe) -> list:
    return [[edit.to_dict() for edit in recipe.draw(np.random.default_rng(k), size)] for size in SIZES for k in SEEDS]


def _presets() -> dict:
    """Preset name -> a function drawing its edit lists."""
    from copynce_hf.pixtrace import CopyRecipe

    return {
        "training@224": lambda: _editor_draws(CopyRecipe.training(), (224, 224)),
        "training@edited_size": lambda: _editor_draws(CopyRecipe.training(), None),
        "off@224": lambda: _editor_draws(CopyRecipe.off(), (224, 224)),
        "paper_descriptor@224": lambda: _editor_draws(CopyRecipe.paper_descriptor(), (224, 224)),
        "paper_descriptor@edited_size": lambda: _editor_draws(CopyRecipe.paper_descriptor(), None),
        "paper_matcher@224": lambda: _editor_draws(CopyRecipe.paper_matcher(), (224, 224)),
        "demo_queries": lambda: _query_draws(CopyRecipe.demo_queries()),
        "minidisc_queries": lambda: _query_draws(CopyRecipe.minidisc_queries()),
        "calibration_copies": lambda: _query_draws(CopyRecipe.calibration_copies()),
    }


def _jsonable(drawn):
    return json.loads(json.dumps(drawn))


@pytest.mark.parametrize("preset", list(json.loads(FIXTURE.read_text())) if FIXTURE.exists() else [])
def test_preset_draws_are_pinned(preset):
    recorded = json.loads(FIXTURE.read_text())[preset]
    drawn = _jsonable(_presets()[preset]())
    assert len(drawn) == len(recorded)
    for k, (new, old) in enumerate(zip(drawn, recorded)):
        assert json.dumps(new) == json.dumps(old), f"{preset}: draw {k} changed"  # the text: 1 and 1.0 differ


def test_fixture_covers_every_preset():
    assert FIXTURE.exists() and set(json.loads(FIXTURE.read_text())) == set(_presets())


if __name__ == "__main__":  # regenerate the fixture (only for a deliberate change of the draws)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    FIXTURE.write_text(json.dumps({name: _jsonable(draw()) for name, draw in _presets().items()}, indent=None) + "\n")
    print(f"wrote {FIXTURE}")
