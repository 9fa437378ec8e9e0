"""The docs: docs/install.md agrees with the chart (its values table and its store
stanzas), and every link in every Markdown file resolves inside the repository."""

from __future__ import annotations

from pathlib import PurePosixPath

from tests.chart.markdown_links import problems, tracked_files, tracked_markdown
from tests.chart.render import notes_streamjob
from tests.chart.values_doc import DOC, with_table
from tests.support import REPO


def test_the_values_table_is_generated_from_the_current_schema() -> None:
    doc = DOC.read_text()
    assert doc == with_table(doc), "the values table is stale: python -m tests.chart.values_doc"


def test_the_documented_stanzas_are_what_the_chart_prints() -> None:
    doc = DOC.read_text()
    tls = {"stateStore": {"managed": {"tls": {"enabled": True}}}}
    for values in ({}, {"stateStore": {"managed": {"mode": "cluster"}}}, tls):
        store = notes_streamjob(values)["spec"]["stateStore"]
        assert f"url: {store['url']}" in doc
        assert f"secretRef: {store['secretRef']}" in doc


def test_every_link_in_the_markdown_files_resolves_inside_the_repository() -> None:
    files = {path: (REPO / path).read_text() for path in tracked_markdown(REPO)}
    assert PurePosixPath("docs/design.md") in files
    assert problems(files, tracked_files(REPO)) == []


def test_the_link_check_finds_each_kind_of_bad_link() -> None:
    tracked = {PurePosixPath(p) for p in ("README.md", "docs/a.md", "docs/b.png", "src/x.py")}
    files = {
        PurePosixPath("README.md"): "# Top\n[a](docs/a.md#a-b) [up](#top) [dir](src/)\n",
        PurePosixPath("docs/a.md"): (
            "## A `b`\n"
            "![img](b.png) [x](../src/x.py)\n"
            "[gone](missing.md) [design](../../shared/DESIGN.md)\n"
            "[web](https://example.org/) [abs](/etc/passwd) [anchor](../README.md#nope)\n"
            "`[code](nope.md)`\n"
            "```\n[fenced](nope.md)\n```\n"
        ),
    }
    assert problems(files, tracked) == [
        "docs/a.md:3: missing.md: no such file in the repository (docs/missing.md)",
        "docs/a.md:3: ../../shared/DESIGN.md: links outside the repository (../ past its root)",
        "docs/a.md:4: https://example.org/: links outside the repository",
        "docs/a.md:4: /etc/passwd: links outside the repository",
        "docs/a.md:4: ../README.md#nope: README.md has no heading with the anchor #nope",
    ]
