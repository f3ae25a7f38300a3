"""Query results and stored text as the terminal and the dashboard's Markdown show them
(``specscope.results``): nothing stored can format, move or break the line it is put in."""

from __future__ import annotations

import io

import pytest

from specscope.results import markdown_code, markdown_prose, write_table

BLOCKS = "eng\n\n# ALL RUNS HEALTHY\n\n* item\r\n---\u2028> quote"


def test_a_column_name_cannot_drive_the_terminal() -> None:
    """A view's column name is stored text: ESC and BEL printed raw retitled and cleared the terminal
    (an attack trial)."""
    out = io.StringIO()
    write_table(["run_id\x1b]0;owned\x07\x1b[2J"], [("a",)], out)
    header = out.getvalue().splitlines()[0]
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert header == "run_id\\x1b]0;owned\\x07\\x1b[2J"


@pytest.mark.parametrize("render", [markdown_prose, markdown_code])
def test_stored_text_stays_on_its_line_in_markdown(render) -> None:
    """A line break let a stored engine name start a heading, a list and a rule inside the line of
    runs (an attack trial); a blank line would also end a code span's paragraph."""
    shown = render(BLOCKS)
    assert not any(c in shown for c in "\n\r\u2028")


@pytest.mark.parametrize("markup", ["**bold**", "~~struck~~", "$x^2$", "# heading"])
def test_inline_markup_in_stored_text_is_escaped(markup: str) -> None:
    shown = markdown_prose(markup)
    assert all(f"\\{c}" in shown for c in set(markup) & set("*~$#"))
