"""The test suite's own set-up: what makes it fast must really hold (a broken one only shows as a slower CI)."""

import pytest


@pytest.fixture(scope="module")
def shared() -> object:
    return object()


def test_module_fixture_users_form_one_xdist_group(shared, request):
    """conftest's group_module_fixture_users puts the tests that share a module fixture (a model trained once for the
    file) in one xdist group, so one worker makes it once. pytest-xdist carries the group in the test's node id; when
    that fails (pytest 9.2 with pytest-xdist 3.8) every worker trains the same models again, and nothing else says
    so."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by a pytest-xdist worker with --dist loadgroup (pyproject's addopts)")
    assert request.node.nodeid.endswith(f"@{request.node.module.__name__}"), request.node.nodeid
