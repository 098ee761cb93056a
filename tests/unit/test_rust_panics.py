"""delta-rs's panic reports are told apart from the rest of stderr (jobs.tables.rust_panics)."""

from __future__ import annotations

import logging
import os
import sys

import pytest

from jobs.tables.rust_panics import quiet_rust_panics, split_panics

REPORT = (
    "thread 'tokio-rt-worker' (5314) panicked at /cargo/object_store/src/buffered.rs:369:41:\n"
    "Already shut down\n"
    "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
)
BACKTRACE = (
    "thread 'tokio-rt-worker' panicked at src/lib.rs:1:1:\n"
    "Already shut down\n"
    "stack backtrace:\n"
    "   0: rust_begin_unwind\n"
    "             at /rustc/library/std/src/panicking.rs:652:5\n"
    "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n"
)
RECORD = "2026-12-02 03:00:00,123 INFO jobs.commands.audit: audit R: 5 ledgers\n"


def test_a_report_ending_in_its_note_is_taken_out_with_the_blank_line_before_it() -> None:
    kept, panics = split_panics(RECORD + "\n" + REPORT + RECORD)
    assert kept == RECORD + RECORD
    assert panics == [REPORT]


def test_a_backtrace_is_part_of_its_report() -> None:
    kept, panics = split_panics(BACKTRACE + RECORD)
    assert kept == RECORD and panics == [BACKTRACE]


def test_a_report_without_its_note_ends_at_the_next_log_record_or_the_end() -> None:
    cut = "thread 'main' panicked at a.rs:1:1:\nboom\n   0: frame\n"
    json_record = '{"level": "INFO", "message": "x"}\n'
    kept, panics = split_panics(cut + json_record + cut)
    assert kept == json_record
    assert panics == [cut, cut]


def test_two_reports_in_a_row_are_two() -> None:
    kept, panics = split_panics(REPORT + REPORT)
    assert kept == "" and panics == [REPORT, REPORT]


def test_text_without_a_report_is_kept_whole() -> None:
    text = RECORD + "a line that only mentions a thread panicked at noon\n"
    assert split_panics(text) == (text, [])


def test_what_reaches_descriptor_2_meanwhile_is_written_back_without_the_report(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Written to the descriptor itself, as Rust's panic hook does, and through sys.stderr."""
    caplog.set_level(logging.INFO)
    with quiet_rust_panics():
        os.write(2, ("\n" + REPORT).encode())
        print("kept through sys.stderr", file=sys.stderr)
        os.write(2, b"kept through the descriptor\n")
    err = capfd.readouterr().err
    assert "panicked" not in err
    assert "kept through sys.stderr" in err and "kept through the descriptor" in err


def test_with_debug_on_nothing_is_redirected(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with quiet_rust_panics():
        os.write(2, REPORT.encode())
    assert "panicked" in capfd.readouterr().err
