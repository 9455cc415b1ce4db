"""docker/check_manifests.py's checks, for fresh_process.call: it imports kserve (the
InferenceService schema), which a test process with tritonclient.grpc loaded cannot."""

from __future__ import annotations

import importlib.util

from helpers.processes import ROOT


def _check():
    spec = importlib.util.spec_from_file_location("check_manifests", ROOT / "docker" / "check_manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list) -> int:
    return _check().main(argv)


def errors_of(docs: list) -> list[list[str]]:
    check = _check()
    return [check.errors(d) for d in docs]
