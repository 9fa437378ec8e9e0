"""State handles, declared by name with defaults, over a plain dict."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec
import pytest

from keyshift.runtime.api import (
    BytesAccess,
    Job,
    JobLoadError,
    ListState,
    MapState,
    ValueState,
    load_job,
)


class DictAccess(BytesAccess):
    def __init__(self) -> None:
        self.data: dict[str, bytes | None] = {}

    def read(self, state: str) -> bytes | None:
        return self.data.get(state)

    def write(self, state: str, value: bytes | None) -> None:
        self.data[state] = value

    def names(self) -> Iterable[str]:
        return self.data


class Point(msgspec.Struct):
    x: int
    y: int


def test_value_state_has_a_default_and_typed_values() -> None:
    access = DictAccess()
    count = ValueState("count", int, default=0).bind(access)
    assert count.value() == 0
    count.update(count.value() + 5)
    assert count.value() == 5
    point = ValueState("p", Point).bind(access)
    assert point.value() is None
    point.update(Point(1, 2))
    assert point.value() == Point(1, 2)
    count.clear()
    assert count.value() == 0 and access.data["count"] is None


def test_map_state_get_put_remove_iterate() -> None:
    seen = MapState("seen", str, int).bind(DictAccess())
    assert seen.get("a") is None and len(seen) == 0
    seen.put("a", 1)
    seen.put("b", 2)
    assert seen.get("a") == 1 and "b" in seen
    assert sorted(seen.items()) == [("a", 1), ("b", 2)]
    seen.remove("a")
    seen.remove("zzz")
    assert list(seen) == ["b"]
    seen.clear()
    assert len(seen) == 0


def test_list_state_append_iterate_clear() -> None:
    events = ListState("events", str).bind(DictAccess())
    assert list(events) == []
    events.append("a")
    events.extend(["b", "c"])
    assert list(events) == ["a", "b", "c"] and len(events) == 3
    events.clear()
    assert events.get() == []


def test_state_names_are_checked_and_unique() -> None:
    with pytest.raises(ValueError, match="invalid state name"):
        ValueState("a/b", int)
    s = ValueState("x", int)
    with pytest.raises(ValueError, match="declared twice"):
        Job(
            name="j", process=lambda r, c: None, key_by=lambda r: r, states=[s, ListState("x", int)]
        )


def test_load_job_imports_the_entrypoint(tmp_path: Path) -> None:
    job = load_job("examples.counter:job")
    assert job.name == "counter" and job.state_names == ["count", "total"]
    with pytest.raises(JobLoadError, match="module:attribute"):
        load_job("examples.counter")
    (tmp_path / "broken_job.py").write_text("raise ValueError('no config')\n")
    with pytest.raises(JobLoadError, match="its module raised ValueError: no config"):
        load_job("broken_job:job", [str(tmp_path)])
    with pytest.raises(JobLoadError, match="not a Job"):
        load_job("examples.counter:process")
    with pytest.raises(JobLoadError, match=r"'examples\.nope:job' cannot be loaded: No module"):
        load_job("examples.nope:job")
    with pytest.raises(JobLoadError, match=r"cannot be loaded: .* no attribute 'jobb'"):
        load_job("examples.counter:jobb")
