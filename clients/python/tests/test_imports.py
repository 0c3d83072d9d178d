"""Every module of the package imports on its own, first, in a fresh
interpreter (issue 29): a circle of imports that only works in one order
fails here, whichever module a user happens to import first."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import ratekeeper

MODULES = sorted(
    info.name for info in pkgutil.walk_packages(ratekeeper.__path__, prefix="ratekeeper.")
)


def test_the_package_has_its_modules():
    assert {"ratekeeper._async.client", "ratekeeper.openai", "ratekeeper.anthropic"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(module: str):
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
