"""notebooks/underreplication.ipynb executed top to bottom (nbclient, a real IPython kernel
and its own Spark session) against the real test warehouse; each query cell's output names
the expected ledgers, bookies and statuses."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.report.conftest import REPO, ReportWarehouse

pytestmark = pytest.mark.integration

NOTEBOOK = REPO / "notebooks" / "underreplication.ipynb"


def _outputs_by_tag(nb: nbformat.NotebookNode) -> dict[str, str]:
    texts: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        parts = []
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"cell failed: {out.get('evalue')}"
            if out.output_type == "stream":
                parts.append(out.text)
            elif "data" in out:
                parts.append(out.data.get("text/plain", ""))
        for tag in cell.metadata.get("tags", []):
            texts[tag] = "\n".join(parts)
    return texts


def test_notebook_answers_the_operator_questions(
    report_warehouse: ReportWarehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wh = report_warehouse
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "commit the notebook without outputs"
    )
    monkeypatch.setenv("BKAUDIT_WAREHOUSE", wh.path)
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    out = _outputs_by_tag(nb)

    bookies = out["bookies"]
    assert wh.victim in bookies and "BOOKIE_LOST" in bookies
    for lid in wh.expected:
        assert str(lid) in bookies
    # one row: the victim; four ledgers, and the healthy ledger is not in its list
    row = next(line for line in bookies.splitlines() if wh.victim in line)
    assert f"[{', '.join(str(x) for x in sorted(wh.expected))}]" in row

    severity = out["severity"]
    for run_id in wh.runs:
        assert run_id in severity

    repair = out["repair"]
    for lid in (wh.below_aq, wh.below_wq):
        assert str(wh.repaired_at[lid])[:19] in repair
    assert "median_hours" in repair

    # pandas rows: index, ledger_id, status, ...
    stuck = {
        (int(cols[1]), cols[2])
        for cols in (line.split() for line in out["stuck"].splitlines())
        if len(cols) > 2 and cols[0].isdigit()
    }
    assert stuck == {(wh.no_replica, "NO_REPLICA"), (wh.open_ledger, "WAITING_GRACE")}

    # pandas rows: index, date, time, copies, entries_copied, bytes_copied, bytes_per_second
    # (the two copies may fall in one hour or two)
    rows = [line.split() for line in out["throughput"].splitlines()]
    copied = sum(int(cols[5]) for cols in rows if len(cols) == 7 and cols[0].isdigit())
    assert copied == sum(b for _, b in wh.copied.values())
