"""docs/install.md agrees with the chart: its values table and its store stanzas."""

from __future__ import annotations

from tests.chart.render import notes_streamjob
from tests.chart.values_doc import DOC, with_table


def test_the_values_table_is_generated_from_the_current_schema() -> None:
    doc = DOC.read_text()
    assert doc == with_table(doc), "the values table is stale: python -m tests.chart.values_doc"


def test_the_documented_stanzas_are_what_the_chart_prints() -> None:
    doc = DOC.read_text()
    for values in ({}, {"stateStore": {"managed": {"mode": "cluster"}}}):
        store = notes_streamjob(values)["spec"]["stateStore"]
        assert f"url: {store['url']}" in doc
        assert f"secretRef: {store['secretRef']}" in doc
