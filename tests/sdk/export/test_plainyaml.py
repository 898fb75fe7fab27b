"""YAML without PyYAML: whatever plain data is written, PyYAML reads back the same."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterbook.export.plainyaml import dump

# Words YAML readers take for something else, and strings that test the block and quote rules.
TRICKY = [
    *("yes", "No", "ON", "off", "y", "N", "true", "False", "null", "Null", "~", ""),
    *("1", "-1", "+1", "0x1f", "0o17", "1e3", "1_000", ".5", ".inf", "-.inf", ".nan", "12:30"),
    *("2001-12-14", "-", "- a", "a: b", "a:b", "#x", "a #b", "&a", "*a", "!t", "%x", "@x", "`x"),
    *("|", ">", "> x", "{}", "[]", "{a: 1}", "'q'", '"q"', "?", "? x", ",", "<<", "="),
    *("a\n", "\nb", "  a\nb", " x\n y", "a\n\n", "a\n\n\n", "\ta\nb", "a\r\nb", "a\rb"),
    *("\x85a\nb", "\ufeffx\ny", "x\u2028y", "x\u2029y", "a\nb\n", "a\n  b\n", "\n\n a", "a\n \n"),
    *("a\n\t\n", "a #b\nc", "caf\u00e9", "\u00a0", "\x7f", "\x00", "\x1b[0m", "\U0001f600"),
    *("/usr/sbin/sshd", "-De", "set -e\nexec x\n", "a'b", 'a"b', "a\\b", "$HOME", "a b "),
]


def test_the_words_yaml_would_misread_are_quoted() -> None:
    for text in TRICKY:
        assert yaml.safe_load(dump(text)) == text, text
        assert yaml.safe_load(dump({text: text})) == {text: text}, text
    assert dump("yes") == '"yes"\n'
    assert dump("/usr/sbin/sshd") == "/usr/sbin/sshd\n"
    assert dump({"a": "x\ny\n"}) == "a: |\n  x\n  y\n"
    assert dump({"a": "x\ny"}) == "a: |-\n  x\n  y\n"


def test_structure() -> None:
    data = {
        "list": [1, True, None, {"k": "v", "m": [{"deep": "x\ny\n"}]}, [], {}, ["a", ["b"]]],
        "empty": {},
        "nothing": [],
    }
    text = dump(data)
    assert yaml.safe_load(text) == data
    assert text.startswith("list:\n  - 1\n  - true\n  - null\n  - k: v\n    m:\n")


@pytest.mark.parametrize("bad", [{1: "a"}, 1.5, b"bytes", {"a": object()}, {"a": {1, 2}}])
def test_what_it_cannot_write_is_a_type_error(bad: Any) -> None:
    with pytest.raises(TypeError):
        dump(bad)


_text = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",))),
    st.sampled_from(TRICKY),
    st.text(st.sampled_from("ab \n\t#:-|'\"\\"), max_size=12),
)
_data = st.recursive(
    st.one_of(_text, st.integers(), st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(_data)
def test_any_plain_data_reads_back_the_same(data: Any) -> None:
    assert yaml.safe_load(dump(data)) == data
