"""Names as data: ``shown()`` writes out every character a terminal would act on."""

from __future__ import annotations

from fdtrace.display import markdown_shown, shown, shown_lines


def test_escape_sequences_newlines_and_overrides_become_visible() -> None:
    assert shown("\x1b]0;PWNED\x07\x1b[2J") == "\\x1b]0;PWNED\\x07\\x1b[2J"
    assert shown("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert shown("\x9b31m") == "\\x9b31m"  # the 8-bit CSI
    assert shown("evil\u202etxt.exe") == "evil\\u202etxt.exe"  # right-to-left override
    assert shown("haproxy-worker é ∞") == "haproxy-worker é ∞"
    assert shown(123) == "123"


def test_lines_keep_their_own_breaks_only() -> None:
    assert shown_lines("one\x1b[2J\ntwo") == "one\\x1b[2J\ntwo"


def test_markdown_markup_is_escaped() -> None:
    assert markdown_shown("<svg onload=1>") == "\\<svg onload=1\\>"
    assert markdown_shown("[x](javascript:alert(1))") == "\\[x\\](javascript:alert(1))"
    assert markdown_shown("a|b\n") == "a\\|b\\\\n"
