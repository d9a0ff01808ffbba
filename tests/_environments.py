"""A fresh virtual environment that sees the packages of the interpreter running the tests.

``venv``'s ``system_site_packages=True`` shows the new environment the site-packages of the *base*
interpreter: right when the tests run on the system's Python, wrong when they run in a virtual
environment (``make test`` in a venv), whose packages (torch, transformers, ...) live in the venv and
not in its base. :func:`environment_with_running_packages` instead lists the running interpreter's own
site-packages folders in a ``.pth`` file of the new environment, so that it sees the same packages
either way, after its own (a package installed into it comes first).
"""

from __future__ import annotations

import site
import subprocess
import venv
from pathlib import Path

#: The ``.pth`` file written into the new environment's site-packages.
PTH_NAME = "_running_interpreter_packages.pth"


def running_site_folders() -> list[str]:
    """The site-packages folders of the running interpreter (a venv's, and its base's when it includes them)."""
    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [folder for folder in dict.fromkeys(folders) if Path(folder).is_dir()]


def environment_with_running_packages(folder: Path) -> Path:
    """Create a virtual environment (without pip) in ``folder`` that also sees :func:`running_site_folders`;
    returns its ``python``."""
    folder = Path(folder)
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(folder)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # site.addsitedir also runs the .pth files of those folders (namespace packages, editable installs)
    lines = "".join(f"import site; site.addsitedir({folder!r})\n" for folder in running_site_folders())
    (Path(purelib) / PTH_NAME).write_text(lines, encoding="utf-8")
    return python
