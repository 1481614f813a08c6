"""The shipped type information is true: the stubs match the extension, the facade type-checks."""

import importlib.util
import subprocess
import sys

import pytest

# mypy runs in subprocesses only: the test process need not import it (pytest imports every
# test module before running any test).
if importlib.util.find_spec("mypy") is None:
    pytest.skip("mypy not installed (scripts/test.sh installs it)", allow_module_level=True)


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd="/"
    )


def test_stubs_match_the_extension_module():
    proc = mypy("mypy.stubtest", "chute._chute")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_package_type_checks_strictly():
    proc = mypy("mypy", "--strict", "--no-incremental", "-p", "chute")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_py_typed_is_shipped():
    import chute

    from pathlib import Path

    pkg = Path(chute.__file__).parent
    assert (pkg / "py.typed").exists() and (pkg / "_chute.pyi").exists()
