"""Pytest fixtures for the fake Kubernetes API server (a TEST DOUBLE).

Registered through ``pytest_plugins = ["tests.kubeapi.fixtures"]`` in
``tests/conftest.py``. Each test gets a fresh server; teardown fails the test
if a simulated component raised or a server thread outlived the harness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from .harness import KubeHarness


def _leaked_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith("kubeapi") and t.is_alive()]


@pytest.fixture
def make_kube() -> Iterator[Callable[..., KubeHarness]]:
    """Factory: ``make_kube(kubernetes_version="1.31", nodes=(...))`` starts a harness."""
    started: list[KubeHarness] = []

    def factory(**options) -> KubeHarness:
        harness = KubeHarness(**options).start()
        started.append(harness)
        return harness

    yield factory
    for harness in started:
        harness.stop()
    errors = [e for h in started for e in h.observer_errors]
    assert not errors, f"simulated Kubernetes components raised: {errors!r}"
    leaked = _leaked_threads()
    assert not leaked, f"fake API server threads still alive after stop: {leaked}"


@pytest.fixture
def kube(make_kube) -> KubeHarness:
    """A fresh fake Kubernetes API server with default options (Kubernetes 1.29)."""
    return make_kube()
