"""No module of bklib or jobs imports another module's private names.

A name with a leading underscore is an implementation detail of its module: importing it from
elsewhere (as ``connection_v2`` once imported ``_Channel`` from ``connection``) couples the two
silently, and the owner can no longer change it. Shared code gets a public name in a module of
its own (``bklib.client.transport``). Tests may still reach into a module's privates; product
code may not.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = ("bklib", "jobs")


def _private(name: str) -> bool:
    # Dunders (``__version__``, ``__all__``) are public protocol, not implementation details.
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(package: str, root: Path = REPO) -> list[str]:
    """``path:line: from module import name`` for every import, in the modules under
    ``root/package``, of a private name (or through a private module) of bklib or jobs;
    relative imports count too."""
    hits: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] not in OURS:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}: from {'.' * node.level}{module}"
            if any(_private(part) for part in module.split(".") if part):
                hits.append(f"{where} (private module)")
            hits += [f"{where} import {a.name}" for a in node.names if _private(a.name)]
    return hits


def test_private_imports_are_found(tmp_path: Path) -> None:
    """The scan sees what it must (else the tests below would pass vacuously)."""
    (tmp_path / "bklib" / "sub").mkdir(parents=True)
    (tmp_path / "bklib" / "sub" / "mod.py").write_text(
        "from bklib.client.transport import Channel, _flush\n"
        "from .sibling import _helper\n"
        "from bklib._internal import thing\n"
        "from bklib import __version__\n"
        "from os import _exit\n"
        "import bklib.client\n"
    )
    assert private_imports("bklib", tmp_path) == [
        "bklib/sub/mod.py:1: from bklib.client.transport import _flush",
        "bklib/sub/mod.py:2: from .sibling import _helper",
        "bklib/sub/mod.py:3: from bklib._internal (private module)",
    ]


def test_bklib_imports_no_private_names() -> None:
    assert private_imports("bklib") == []


def test_jobs_imports_no_private_names() -> None:
    assert private_imports("jobs") == []
