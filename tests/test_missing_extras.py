"""A missing optional extra (or tool) skips a test where a developer runs it, and fails it in CI.

The helpers of ``tests/conftest.py`` (``require_extra``, ``has_extra``, ``require_program``, ``missing_extra``)
are the one way the tests depend on an extra; ``.ci/run`` installs every extra and sets ``CI``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

TESTS = Path(__file__).resolve().parent
MISSING = "copynce_no_such_module"

CASES = {
    "test_in_a_test.py": f"""
from conftest import require_extra

def test_needs_it():
    require_extra("{MISSING}", "bench")
""",
    "test_in_a_fixture.py": f"""
import pytest
from conftest import require_extra

@pytest.fixture(scope="module", autouse=True)
def extra():
    require_extra("{MISSING}", "onnx")

def test_needs_it():
    pass
""",
    "test_both_ways.py": f"""
from conftest import has_extra

def test_checks_either_case():
    assert has_extra("{MISSING}", "bench") is False
""",
    "test_a_program.py": """
from conftest import require_program

def test_needs_it():
    require_program("copynce-no-such-program", "apt-get install it")
""",
}


def _outcomes(folder: Path, ci: str | None) -> dict[str, tuple[str, str]]:
    """``{file name: (outcome, message)}`` of the cases run in one fresh pytest with ``CI`` set to ``ci``
    (``None``: unset); outcome ``passed``, ``skipped``, ``failure`` or ``error`` (a failure while collecting)."""
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    if ci is not None:
        env["CI"] = ci
    report = folder / f"report-{ci}.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder),
                    f"--junitxml={report}", *(str(folder / name) for name in CASES)], capture_output=True, text=True,
                   env=env, cwd=folder, timeout=300)
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = (case.get("classname") or case.get("name")).split(".")[-1] + ".py"
        found = [(child.tag, child.get("message") or "") for child in case if child.tag in ("skipped", "failure",
                                                                                            "error")]
        outcomes[name] = found[0] if found else ("passed", "")
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str | None, dict[str, tuple[str, str]]]:
    folder = tmp_path_factory.mktemp("extras")
    for name, code in CASES.items():
        (folder / name).write_text(code)
    return {ci: _outcomes(folder, ci) for ci in (None, "false", "true")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_missing_extra_skips_outside_ci_and_fails_in_ci(outcomes, name):
    expected = "passed" if name == "test_both_ways.py" else "skipped"  # has_extra: the branch without the extra
    outcome, message = outcomes[None][name]
    assert outcome == expected, (outcome, message)
    assert expected == "passed" or "not installed" in message or "from the '" in message
    assert outcomes["false"][name][0] == expected  # CI=false is not CI
    outcome, message = outcomes["true"][name]
    assert outcome in ("failure", "error"), (outcome, message)
    assert "in CI every extra the tests use must be installed" in message


def test_tests_depend_on_extras_only_through_the_helpers():
    """No ``pytest.importorskip`` or ``skipif`` on an import (those would skip in CI too), and no helper called at
    a module's top level (in CI its failure would stop the whole run while collecting: a fixture fails only the
    tests that need the extra)."""
    for path in sorted(TESTS.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "importorskip" not in text or path.name == Path(__file__).name, path.name
        assert not re.search(r"skipif\([^)]*(find_spec|which)", text), path.name
        assert not re.search(r"^(\w+ = )?(require_extra|require_program|has_extra|missing_extra)\(", text, re.M), path.name
