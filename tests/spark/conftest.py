"""One SparkSession (local[2], Delta configured) for the whole test session."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from tests.audit_helpers import shared_spark


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The shared SparkSession; stopped when the test process exits."""
    return shared_spark()
