"""bkaudit's version, written once: the static ``version`` of ``pyproject.toml``, read at run
time from the installed distribution's metadata (:mod:`importlib.metadata`). A ``pip install``
and an editable ``make venv`` both record it; the history is in ``CHANGELOG.md``."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version

__all__ = ["DISTRIBUTION", "UNKNOWN", "__version__", "extra_hint", "package_version"]

DISTRIBUTION = "bkaudit"
UNKNOWN = "unknown"
"""What bklib reports when no bkaudit distribution is installed: modules imported from a
``--py-files`` zip on a Spark executor, or a checkout on ``sys.path`` that was never
installed. Never a guessed number."""


def package_version() -> str:
    """The installed bkaudit's version, e.g. ``0.1.0``, or :data:`UNKNOWN`."""
    try:
        return distribution_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def extra_hint(extra: str) -> str:
    """How to install one of bkaudit's extras (``spark``, ``oxia``): bkaudit is on no package
    index, so it names the checkout's and the wheel's forms (README.md, "Install")."""
    return (
        f"pip install '.[{extra}]' in the bkaudit checkout "
        f"(or 'bkaudit-{package_version()}-py3-none-any.whl[{extra}]')"
    )


__version__ = package_version()
