"""Namespace routing (segfuse.scaleout.routing): the header rule, and rendezvous hashing's stability,
minimal movement and spread. The oracle for movement is a recomputation over the new shard set."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
import xxhash
from segfuse.scaleout.routing import DEFAULT_NAMESPACE, NamespaceError, parse_namespace, shard_for

SHARDS = [f"shard-{i}" for i in range(4)]
NAMESPACES = [f"tenant-{i}" for i in range(2000)]


def test_absent_header_is_the_default_namespace():
    assert parse_namespace(None) == DEFAULT_NAMESPACE == "default"


@pytest.mark.parametrize("name", ["a", "A9", "team.a_b-c", "x" * 63])
def test_good_names(name):
    assert parse_namespace(name) == name


@pytest.mark.parametrize("name", ["", "-a", ".a", "a b", "a/b", "é", "x" * 64, "a\n"])
def test_bad_names_name_the_header(name):
    with pytest.raises(NamespaceError, match="Segfuse-Namespace"):
        parse_namespace(name)


def test_weight_is_xxh32_of_the_namespace_seeded_by_the_shard():
    # An independent computation of the documented hash (what HAProxy's xxh32 converter computes):
    # clients that shard directly and the router must agree.
    def oracle(ns, shards):
        return max(shards, key=lambda s: (xxhash.xxh32(ns.encode(), seed=xxhash.xxh32(s.encode()).intdigest())
                                          .intdigest(), [-ord(c) for c in s]))

    assert all(shard_for(ns, SHARDS) == oracle(ns, SHARDS) for ns in NAMESPACES[:200])


def test_stable_across_processes_and_shard_order():
    # A new interpreter has another PYTHONHASHSEED: the choice must not depend on it, nor on order.
    code = ("from segfuse.scaleout.routing import shard_for;"
            f"print(','.join(shard_for(n, {SHARDS!r}) for n in {NAMESPACES[:100]!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345"}).stdout.strip().split(",")
    assert out == [shard_for(n, SHARDS) for n in NAMESPACES[:100]]
    assert out == [shard_for(n, list(reversed(SHARDS))) for n in NAMESPACES[:100]]


def test_adding_a_shard_moves_only_namespaces_to_it():
    before = {n: shard_for(n, SHARDS) for n in NAMESPACES}
    after = {n: shard_for(n, [*SHARDS, "shard-4"]) for n in NAMESPACES}
    moved = [n for n in NAMESPACES if before[n] != after[n]]
    assert moved and all(after[n] == "shard-4" for n in moved)
    assert 0.1 < len(moved) / len(NAMESPACES) < 0.3  # about 1/5 of them


def test_removing_a_shard_moves_only_its_namespaces():
    before = {n: shard_for(n, SHARDS) for n in NAMESPACES}
    after = {n: shard_for(n, [s for s in SHARDS if s != "shard-2"]) for n in NAMESPACES}
    moved = {n for n in NAMESPACES if before[n] != after[n]}
    assert moved == {n for n in NAMESPACES if before[n] == "shard-2"}


def test_spread():
    counts = Counter(shard_for(n, SHARDS) for n in NAMESPACES)
    assert set(counts) == set(SHARDS)
    assert all(abs(c - 500) < 100 for c in counts.values()), counts  # binomial sd ~19


def test_no_shards():
    with pytest.raises(ValueError, match="no shards"):
        shard_for("a", [])
