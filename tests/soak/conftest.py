"""Options and fixtures of the chaos soak and the kill campaign (see tests/soak/chaos.py).

``--soak-minutes``, ``--soak-kills`` and ``--soak-seed`` are registered in tests/conftest.py;
each falls back to ``$BKAUDIT_SOAK_MINUTES`` / ``_KILLS`` / ``_SEED``, then to the short
variant ``make test`` runs. Java BookKeeper is installed like the interop tests do: missing, it
is a failure, never a skip.
"""

from __future__ import annotations

import os

import pytest

from tests.interop import harness


def _option(config: pytest.Config, name: str, env: str, default: str) -> str:
    value = config.getoption(name, default=None)
    return str(value) if value is not None else os.environ.get(env, default)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The suite-wide 300 s timeout is for ordinary tests; a soak's length is an option.
    minutes = float(_option(config, "--soak-minutes", "BKAUDIT_SOAK_MINUTES", "0.5"))
    kills = int(_option(config, "--soak-kills", "BKAUDIT_SOAK_KILLS", "5"))
    budget = {"test_chaos_soak.py": minutes * 60 + 900, "test_kill_campaign.py": kills * 40 + 600}
    for item in items:
        seconds = budget.get(item.path.name)
        if seconds is not None:
            item.add_marker(pytest.mark.timeout(int(seconds)))


@pytest.fixture
def soak_minutes(pytestconfig: pytest.Config) -> float:
    return float(_option(pytestconfig, "--soak-minutes", "BKAUDIT_SOAK_MINUTES", "0.5"))


@pytest.fixture
def soak_kills(pytestconfig: pytest.Config) -> int:
    return int(_option(pytestconfig, "--soak-kills", "BKAUDIT_SOAK_KILLS", "5"))


@pytest.fixture
def soak_seed(pytestconfig: pytest.Config) -> int:
    return int(_option(pytestconfig, "--soak-seed", "BKAUDIT_SOAK_SEED", "20261122"))


@pytest.fixture(scope="session")
def soak_classpath() -> str:
    try:
        return harness.install()
    except harness.JavaUnavailable as e:
        pytest.fail(f"Java BookKeeper unavailable: {e}", pytrace=False)
