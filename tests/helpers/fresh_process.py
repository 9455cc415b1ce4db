"""Calls that run in a fresh interpreter of their own (multiprocessing's spawn), for libraries that
cannot share the test process: kserve's generated gRPC messages and tritonclient.grpc's define the
same protobuf symbols (package `inference`), and protobuf refuses a second definition in one process
(kserve/kserve#3099). The gRPC tests load tritonclient.grpc in the test processes, so anything that
imports kserve runs through `call`.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def call(fn, *args):
    """fn(*args) (a module-level function, importable by the child) in a fresh interpreter: its
    result, or its exception raised here."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()
