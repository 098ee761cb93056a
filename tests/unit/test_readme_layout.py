"""The README's layout section names the tree as it is: every path it names exists, and every
package under ``bklib/`` and ``jobs/`` is named."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli_helpers import REPO

_ENTRY = re.compile(r"^( *)(\S+)")
_FILE = re.compile(r"(?<![\w/.-])([\w-]+(?:/[\w-]+)*\.(?:py|sh|yaml|conf|properties|ipynb|md))\b")


def _layout_block() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1].strip("\n").splitlines()


def _named_paths() -> tuple[set[Path], set[Path]]:
    """(directories, files) the block names: each line's first word is a path under the
    directory of the nearest less-indented line; bare file names later on a line are in that
    line's directory, names with a slash are from the top of the repository."""
    dirs: set[Path] = set()
    files: set[Path] = set()
    stack: list[tuple[int, Path]] = [(-1, REPO)]
    for line in _layout_block():
        m = _ENTRY.match(line)
        if not m or not line.strip():
            continue
        indent, word = len(m.group(1)), m.group(2)
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        here = parent
        if word.endswith("/"):
            here = parent / word.rstrip("/")
            dirs.add(here)
            stack.append((indent, here))
        for name in _FILE.findall(line):
            # a bare name is in the line's directory; a name with a slash is from the top
            files.add(REPO / name if "/" in name else here / name)
    return dirs, files


def test_every_path_the_layout_names_exists() -> None:
    dirs, files = _named_paths()
    assert dirs and files
    missing = sorted(str(p.relative_to(REPO)) for p in dirs | files if not p.exists())
    assert not missing, f"README layout names paths that do not exist: {missing}"


def test_every_package_of_bklib_and_jobs_is_named() -> None:
    dirs, _ = _named_paths()
    packages = {
        init.parent
        for top in ("bklib", "jobs")
        for init in (REPO / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    unnamed = sorted(str(p.relative_to(REPO)) for p in packages - dirs)
    assert not unnamed, f"README layout does not name these packages: {unnamed}"
