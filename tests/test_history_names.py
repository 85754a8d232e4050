"""Numbering of named keys and values, and reading the names sidecar back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kproxy.workload.names import NameMapper, NamesFormatError, load_names, sidecar_path, write_names


def test_names_are_numbered_above_the_largest_integer_whenever_it_appears():
    mapper = NameMapper()
    mapper.observe_value(":x", ":a")
    mapper.observe_key(-2)
    mapper.observe_value(":x", 9)
    mapper.observe_value(":x", '"b"')
    mapper.observe_key(6)  # seen after :x, still below the names
    assert [mapper.key_id(k) for k in (":x", -2, 6)] == [7, -2, 6]
    assert [mapper.value_id(":x", v) for v in (":a", 9, '"b"')] == [10, 9, 11]
    assert mapper.sidecar() == {"format": 1, "keys": {"7": ":x"}, "values": {"7": {"10": ":a", "11": '"b"'}}}


def test_names_without_any_integer_start_at_zero_and_integers_alone_need_no_sidecar():
    mapper = NameMapper()
    mapper.observe_value(":y", ":a")
    assert (mapper.key_id(":y"), mapper.value_id(":y", ":a")) == (0, 0)
    plain = NameMapper()
    plain.observe_value(1, 2)
    assert plain.sidecar() is None


def test_written_names_read_back(tmp_path: Path):
    history = tmp_path / "h.jsonl"
    content = {"format": 1, "keys": {"0": ":x"}, "values": {"0": {"3": '"a"'}}}
    assert write_names(history, content) == sidecar_path(history)
    assert load_names(history) == {"keys": {"0": ":x"}, "values": {"0": {"3": '"a"'}}}
    assert load_names(tmp_path / "other.jsonl") is None
    # A URL is Spark's to read; nothing beside it is looked for.
    assert load_names("hdfs:///runs/h.jsonl") is None


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not readable as JSON"),
    (json.dumps({"keys": {}}), "not a names sidecar of format 1"),
    (json.dumps({"format": 1, "keys": {"x": ":x"}}), "decimal text of an integer"),
    (json.dumps({"format": 1, "keys": {"0": 5}}), "decimal text of an integer"),
    (json.dumps({"format": 1, "values": {"k": {}}}), "keyed by the decimal text of a key id"),
    (json.dumps({"format": 1, "values": {"0": []}}), "values of key 0 must be an object"),
])
def test_a_broken_sidecar_is_an_error_naming_the_file(tmp_path: Path, content: str, problem: str):
    history = tmp_path / "h.jsonl"
    sidecar_path(history).write_text(content)
    with pytest.raises(NamesFormatError, match=problem) as raised:
        load_names(history)
    assert str(raised.value).startswith(f"{sidecar_path(history)}: ")
