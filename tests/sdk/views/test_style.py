"""The look the views share: durations as people read them, badges, tables, escaping."""

from __future__ import annotations

from clusterbook.views.style import STATE_COLOURS, badge, empty, escaped, seconds, table


def test_durations_read_in_the_largest_unit_that_fits() -> None:
    assert [seconds(v) for v in (None, 4.24, 59.94, 187, 7500)] == [
        "—",
        "4.2 s",
        "59.9 s",
        "3m 07s",
        "2h 05m",
    ]


def test_a_badge_has_its_states_colour_and_a_class_made_of_it() -> None:
    out = badge("timed out")
    assert 'class="cb-state cb-state-timed-out"' in out
    assert f"background:{STATE_COLOURS['timed out']}" in out
    odd = badge('<b onclick="x">')  # a state nobody coloured: the other colour, escaped
    assert "cb-state-b-onclick-x" in odd
    assert "<b " not in odd
    assert "&lt;b onclick=&quot;x&quot;&gt;" in odd


def test_headers_and_empty_views_are_escaped_and_cells_are_taken_as_html() -> None:
    out = table(["<Node>"], [["<i>n1</i>"]], "cb-nodes")
    assert "<th" in out
    assert "&lt;Node&gt;" in out
    assert "<td" in out
    assert "<i>n1</i>" in out
    assert empty("cb-jobs", "No <jobs>").startswith('<div class="cb-jobs cb-empty"')
    assert escaped("a'b\"") == "a&#x27;b&quot;"
