"""The days under which one run's rows can be filed (jobs.tables.delta.run_days): what lets
listunderreplicated, the report and the audit read one run from its own partitions."""

from __future__ import annotations

from datetime import date, datetime, timezone

from jobs.tables.delta import run_days


def _at(day: int, hour: int) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=timezone.utc)


def test_a_run_within_one_day_is_one_partition() -> None:
    run = {"run_id": "20261127T101500Z-1a2b3c4d", "started_at": _at(27, 10),
           "finished_at": _at(27, 11)}  # fmt: skip
    assert run_days(run) == [date(2026, 11, 27)]


def test_a_run_past_midnight_spans_its_days_and_the_one_its_id_names() -> None:
    # Rows written after midnight under a custom id take the day they were written.
    run = {"run_id": "nightly", "started_at": _at(27, 23), "finished_at": _at(29, 0)}
    assert run_days(run) == [date(2026, 11, 27), date(2026, 11, 28), date(2026, 11, 29)]
    # An id stamped with another day (given with --run-id) is where its rows may be filed.
    named = {"run_id": "20200101T000000Z-deadbeef", "started_at": _at(27, 10),
             "finished_at": _at(27, 11)}  # fmt: skip
    assert run_days(named) == [date(2020, 1, 1), date(2026, 11, 27)]


def test_an_unfinished_run_reaches_today() -> None:
    run = {"run_id": "r", "started_at": datetime(2026, 1, 1, tzinfo=timezone.utc),
           "finished_at": None}  # fmt: skip
    before = datetime.now(timezone.utc).date()
    days = run_days(run)
    after = datetime.now(timezone.utc).date()  # the call may straddle midnight
    assert days[0] == date(2026, 1, 1)
    assert days[-1] in (before, after)
    assert len(days) == (days[-1] - days[0]).days + 1


def test_a_finish_stamped_before_the_start_still_names_the_start() -> None:
    run = {"run_id": "r", "started_at": _at(27, 10), "finished_at": _at(26, 23)}
    assert run_days(run) == [date(2026, 11, 27)]
