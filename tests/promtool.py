"""Prometheus's own rule evaluation for the shipped alerts (deploy/monitoring/bkaudit-alerts.yaml):
``promtool test rules`` (built by scripts/install_prometheus.sh) over series a test writes,
synthetic or scraped from a running watch."""

from __future__ import annotations

import functools
import math
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.cli_helpers import REPO

ALERTS = REPO / "deploy" / "monitoring" / "bkaudit-alerts.yaml"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")


@functools.cache
def promtool() -> Path:
    """The promtool scripts/install_prometheus.sh built (it prints its path)."""
    out = subprocess.run(
        [str(REPO / "scripts" / "install_prometheus.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def check_rules(rules: Path = ALERTS) -> subprocess.CompletedProcess[str]:
    """``promtool check rules``: the file, its expressions and its annotation templates."""
    return subprocess.run(
        [str(promtool()), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )


def run_rule_tests(
    tmp: Path, groups: Iterable[Mapping[str, Any]], rules: Path = ALERTS
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of ``groups`` (its ``tests:`` entries) against ``rules``.

    The rules are evaluated as shipped, but without their annotations: an expectation names
    the alert's labels, and the annotations' wording is checked by :func:`check_rules`."""
    doc = yaml.safe_load(rules.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    bare = tmp / "rules.yaml"
    bare.write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = tmp / "tests.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"rule_files": [str(bare)], "evaluation_interval": "1m", "tests": list(groups)},
            sort_keys=False,
        )
    )
    return subprocess.run(
        [str(promtool()), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120
    )


def series(metric: str, labels: Mapping[str, str], values: str) -> dict[str, str]:
    """One ``input_series`` entry."""
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


def scraped_series(page: str, labels: Mapping[str, str], samples: int = 1) -> list[dict[str, str]]:
    """A /metrics page as ``input_series`` of ``samples`` equal samples each (from time 0,
    one per interval: held long enough for a rule's ``for:``), with the target labels
    Prometheus would add (``cluster``, ``instance``, ``job``)."""
    out = []
    extra = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in page.splitlines():
        m = _SAMPLE.match(line)
        if line.startswith("#") or m is None:
            continue
        name, inner, value = m.groups()
        number = float(value)
        text = "Inf" if number == math.inf else "-Inf" if number == -math.inf else repr(number)
        if math.isnan(number):
            text = "NaN"
        joined = ", ".join(p for p in (inner, extra) if p)
        out.append({"series": f"{name}{{{joined}}}", "values": " ".join([text] * samples)})
    return out
