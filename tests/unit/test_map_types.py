"""bcc's descriptions of map key and value types read without bcc (``kernel.programs.ctype_of``):
the forms the programs do not use yet (unions, packed structs, bit fields, anonymous members)
give bcc's own layouts, an array of arrays its C layout, and anything else is a one-line error."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from fdtrace.errors import FdtraceError
from fdtrace.kernel.programs import _decoded_type, ctype_of
from tests.helpers import ctypes_layout

FORMS: list[Any] = [
    "unsigned long long",
    ["pair", [["a", "unsigned int"], ["b", "unsigned char"]], "struct"],
    ["packed", [["a", "unsigned char"], ["b", "unsigned long long"]], "struct_packed"],
    ["either", [["a", "unsigned int"], ["b", "unsigned long long"]], "union"],
    ["bits", [["low", "unsigned int", 3], ["high", "unsigned int", 29], ["next", "short"]], "struct"],
    ["outer", [["", [["x", "int"], ["y", "int"]], "struct"], ["named", [["z", "long"]], "union"]], "struct"],
]


@pytest.mark.parametrize("desc", FORMS, ids=lambda desc: desc if isinstance(desc, str) else desc[0])
def test_each_form_is_laid_out_as_bcc_lays_it_out(desc: Any) -> None:
    bcc = pytest.importorskip("bcc")
    assert ctypes_layout(ctype_of(desc)) == ctypes_layout(bcc.BPF._decode_table_type(desc))


def test_an_array_of_arrays_has_all_its_elements() -> None:
    """char cells[2][3] is six bytes (bcc's own reading keeps only the first dimension)."""
    grid = ctype_of(["grid", [["cells", "char", [2, 3]], ["n", "int"]], "struct"])
    assert (ctypes.sizeof(grid), grid.n.offset, len(grid().cells), len(grid().cells[1])) == (12, 8, 2, 3)


def test_an_anonymous_member_is_reached_through_its_parent() -> None:
    outer = ctype_of(FORMS[-1])()
    outer.x, outer.named.z = 5, 7
    assert (outer.__anon0.x, outer.named.z, ctypes.sizeof(outer)) == (5, 7, 16)


@pytest.mark.parametrize("text", ['"wide int"', '["s", [["a"]], "struct"]', '["s", [["a", "int"]], "enum"]', '42'])
def test_a_description_it_cannot_read_is_one_line(text: str) -> None:
    with pytest.raises(FdtraceError, match="a BPF map's type cannot be used"):
        _decoded_type(text)
