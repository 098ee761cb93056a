"""One bookie-id rule (BookKeeper's ``BookieId.validateBookieId``), used by the metadata model
and by the Python bookie alike."""

from __future__ import annotations

import pytest

from bklib.bookie.registration import check_bookie_id
from bklib.meta.model import is_valid_bookie_id

CASES = [
    ("10.0.0.7:3181", True),
    ("bookie-1.example.com:3181", True),
    ("my_bookie", True),
    ("a;b<c>=d?e@f[g]h^i\\j", True),  # ":-_" in Java's class is the range 0x3A..0x5F
    ("readonly", False),
    ("ReadOnly", False),
    ("", False),
    ("bookie 1", False),
    ("bookie/1", False),
    ("bookie:3181\n", False),  # Java's String.matches is whole-string: no trailing newline
    ("bökie", False),
]


@pytest.mark.parametrize(("bookie_id", "valid"), CASES)
def test_model_and_bookie_apply_the_same_rule(bookie_id: str, valid: bool) -> None:
    assert is_valid_bookie_id(bookie_id) is valid
    if valid:
        assert check_bookie_id(bookie_id) == bookie_id
    else:
        with pytest.raises(ValueError, match="invalid bookie id"):
            check_bookie_id(bookie_id)
