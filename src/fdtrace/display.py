"""Text that came from a process or a recording, shown as data and never as terminal control.

A task name, a command line, a path, a cgroup, a symbol or a line of a HAProxy answer is chosen
by whoever runs the program, and fdtrace shows them to root's terminal. ``shown()`` makes every
character that is not printable visible as an escape (``\\x1b``, ``\\n``, ``\\u202e``), so an
escape sequence cannot retitle or clear the terminal and a newline cannot split a row; every
terminal output and the Markdown report go through it, and the HTML report through ``html_shown()``.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(value: object) -> str:
    """``value`` as text in which every unprintable character (controls, escape sequences,
    newlines, bidirectional overrides) is written out as its escape."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _visible(char) for char in text)


def shown_lines(text: str) -> str:
    """Lines of output whose own line breaks stay, while anything else unprintable in them is
    made visible (the last guard of every line fdtrace writes to a terminal)."""
    if text.isprintable():
        return text
    return "\n".join(shown(line) for line in text.split("\n"))


#: What Markdown (CommonMark, GitHub's tables) would read as markup that does more than emphasis:
#: links and link definitions, images, code, HTML, entities and table cells.
_MARKDOWN_MARKUP = frozenset("\\`[]<>|&")


def html_shown(value: object) -> str:
    """``shown(value)`` for an HTML page (or a Plotly label, which reads HTML entities): its
    escapes made visible first, then ``&``, ``<``, ``>`` and quotes escaped, so a name such as
    ``<svg onload=...>`` or an escape sequence stays text."""
    import html

    return html.escape(shown(value))


def markdown_shown(value: object) -> str:
    """``shown(value)`` for a Markdown page: its markup characters escaped too, so a name such as
    ``<svg onload=...>`` or ``[x](javascript:...)`` stays text."""
    return "".join(f"\\{char}" if char in _MARKDOWN_MARKUP else char for char in shown(value))
