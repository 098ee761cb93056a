"""bklib.states is the one vocabulary: everything public in it is exported, and the modules
that used to spell its names themselves take them from it."""

from __future__ import annotations

import inspect

from bklib import quorum, states


def test_all_names_every_public_name() -> None:
    public = {
        name
        for name, value in vars(states).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and getattr(value, "__module__", states.__name__) in (states.__name__, "builtins")
        and name != "annotations"
    }
    assert public == set(states.__all__)


def test_severities_are_the_states_ones() -> None:
    assert (quorum.NO_REPLICA, quorum.BELOW_AQ, quorum.BELOW_WQ) == states.Severity.ALL
    assert states.CountKey.severity("BELOW_AQ").startswith(states.CountKey.SEVERITY_PREFIX)
