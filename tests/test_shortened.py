"""`shortened` (memory/shorten.py): the one way a text shown or echoed is cut to a limit."""

from __future__ import annotations

from memory.shorten import shortened


def test_a_text_at_the_limit_is_whole() -> None:
    assert shortened("abcde", 5) == "abcde"
    assert shortened("", 1) == ""


def test_a_text_one_over_the_limit_is_cut_to_it_with_an_ellipsis() -> None:
    cut = shortened("abcdef", 5)
    assert cut == "abcd…" and len(cut) == 5


def test_the_whitespace_before_the_ellipsis_is_dropped() -> None:
    assert shortened("ab  \n cdef", 5) == "ab…"


def test_a_limit_of_one_leaves_the_ellipsis_only() -> None:
    assert shortened("ab", 1) == "…"
    assert shortened("a", 1) == "a"


def test_nothing_fits_in_a_limit_of_zero_or_less() -> None:
    assert shortened("abc", 0) == ""
    assert shortened("abc", -4) == ""
    assert shortened("", 0) == ""
