"""The ZooKeeper request budget's arithmetic (bklib.meta.stores.zookeeper.budget), the
``--zk-rate`` parser, and how a Spark run shares the budget among its task slots. The budget
against a real ZooKeeper server is in tests/integration/test_zk_budget.py."""

from __future__ import annotations

import argparse
import threading

import pytest

from bklib.meta.stores.zookeeper.budget import RATE_ENV, RequestBudget, set_request_rate
from jobs.options.units import parse_request_rate
from jobs.spark.session import spark_conf, task_slots

pytestmark = pytest.mark.usefixtures("restore_zk_budget")


class FakeClock:
    """Time that moves only when the budget sleeps (or the test says so)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_the_bucket_holds_a_tenth_of_a_second_and_refills_at_the_rate(clock: FakeClock) -> None:
    budget = RequestBudget(1000, clock=clock, sleep=clock.sleep)
    assert budget.take_up_to(500) == 100  # the burst
    assert budget.take_up_to(5) == 0
    clock.now += 0.02
    assert budget.take_up_to(500) == 20
    clock.now += 10.0  # idle time does not pile up beyond the burst
    assert budget.take_up_to(10_000) == 100
    assert budget.requests == 220 and not clock.slept


def test_acquire_waits_exactly_for_the_missing_token(clock: FakeClock) -> None:
    budget = RequestBudget(50, clock=clock, sleep=clock.sleep)
    for _ in range(5):  # burst: max(1, 50 * 0.1) = 5
        budget.acquire()
    assert not clock.slept
    start = clock.now
    for _ in range(100):
        budget.acquire()
    assert clock.now - start == pytest.approx(100 / 50)
    assert budget.waited == pytest.approx(2.0)
    assert budget.requests == 105


def test_unused_grants_go_back_to_the_bucket(clock: FakeClock) -> None:
    budget = RequestBudget(100, clock=clock, sleep=clock.sleep)
    got = budget.take_up_to(10)
    assert got == 10
    budget.refund(7)
    assert budget.requests == 3
    assert budget.take_up_to(10) == 7


def test_unlimited_grants_everything_and_counts_it(clock: FakeClock) -> None:
    budget = RequestBudget(None, clock=clock, sleep=clock.sleep)
    assert budget.take_up_to(500) == 500
    budget.refund(100)
    budget.acquire()
    assert budget.requests == 401 and not clock.slept


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RequestBudget(0)


def test_threads_share_one_bucket() -> None:
    budget = RequestBudget(2000)
    threads = [
        threading.Thread(target=lambda: [budget.acquire() for _ in range(50)]) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.requests == 100


RATES = [("5000", 5000.0), ("5000/s", 5000.0), ("2.5k", 2500.0), ("20K/s", 20000.0)]
NO_LIMIT: list[tuple[str, float | None]] = [("0", None), ("unlimited", None)]


@pytest.mark.parametrize(("text", "rate"), [*RATES, *NO_LIMIT])
def test_zk_rate_flag_values(text: str, rate: float | None) -> None:
    assert parse_request_rate(text) == rate


@pytest.mark.parametrize("text", ["-5", "fast", "5MB", ""])
def test_bad_zk_rate_is_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="bad request rate"):
        parse_request_rate(text)


@pytest.mark.parametrize(
    ("conf", "slots"),
    [
        ({"spark.master": "local[2]"}, 2),
        ({"spark.master": "local[3,2]"}, 3),
        ({"spark.master": "local"}, 1),
        ({"spark.master": "spark://h:7077", "spark.default.parallelism": "16"}, 16),
        (
            {
                "spark.master": "k8s://h",
                "spark.executor.instances": "5",
                "spark.executor.cores": "4",
            },
            20,
        ),
        ({"spark.master": "spark://h:7077", "spark.cores.max": "12"}, 12),
        ({"spark.master": "yarn"}, 4),
    ],
)
def test_task_slots(conf: dict[str, str], slots: int) -> None:
    assert task_slots(conf) == slots


def test_a_spark_run_gives_each_task_slot_its_share_of_the_budget() -> None:
    key = f"spark.executorEnv.{RATE_ENV}"
    set_request_rate(6000)
    assert spark_conf("local[2]")[key] == "3000"
    assert spark_conf("spark://h:7077", {"spark.cores.max": "8"})[key] == "750"
    assert spark_conf("local[2]", {key: "10"})[key] == "10"  # the operator's own setting stands
    set_request_rate(None)
    assert key not in spark_conf("local[2]")
