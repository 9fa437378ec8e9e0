"""Relative links in the repository's Markdown files, and what is wrong with them.

Pure functions over file contents and a set of paths: ``test_docs.py`` runs them
over every tracked Markdown file. A link is fine when it stays inside the
repository, names a tracked file (or a folder holding one) and, when it has a
``#anchor`` into a Markdown file, a heading of that file (anchors as GitHub makes
them). Links to anywhere else (a URL, an absolute path, ``../`` past the root) are
problems: the docs link only inside the repository.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_INLINE_LINK = re.compile(r"\]\(\s*<?([^\s)>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_MD_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def tracked_markdown(root: Path) -> list[PurePosixPath]:
    """The Markdown files git tracks under ``root`` (paths relative to it)."""
    return [p for p in tracked_files(root) if p.suffix == ".md"]


def tracked_files(root: Path) -> set[PurePosixPath]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    return {PurePosixPath(name) for name in out.split("\0") if name}


def _prose_lines(text: str, *, code_spans: bool = False) -> Iterable[tuple[int, str]]:
    """Lines outside fenced code blocks, with code spans blanked out unless
    ``code_spans``."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line if code_spans else _CODE_SPAN.sub("", line)


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link and image in a Markdown text."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(text):
        found += [(number, m.group(1)) for m in _INLINE_LINK.finditer(line)]
        found += [(number, m.group(1)) for m in _AUTOLINK.finditer(line)]
        reference = _REFERENCE.match(line)
        if reference:
            found.append((number, reference.group(1)))
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication)."""
    text = _MD_LINK_TEXT.sub(r"\1", heading).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The heading anchors of a Markdown text; repeated headings get ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(text, code_spans=True):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def problems(files: Mapping[PurePosixPath, str], tracked: set[PurePosixPath]) -> list[str]:
    """What is wrong with the links of ``files`` (path -> text), one line each.

    ``tracked`` are the repository's files; a link may name one of them, or a
    folder that holds one."""
    folders = {parent for path in tracked for parent in path.parents}
    texts = dict(files)
    found: list[str] = []
    for path, text in files.items():
        for line, target in links(text):
            where = f"{path}:{line}: {target}"
            if _SCHEME.match(target) or target.startswith("/"):
                found.append(f"{where}: links outside the repository")
                continue
            name, _, anchor = target.partition("#")
            resolved = _normalise(path.parent / name) if name else path
            if resolved is None:
                found.append(f"{where}: links outside the repository (../ past its root)")
                continue
            if resolved not in tracked and resolved not in folders:
                found.append(f"{where}: no such file in the repository ({resolved})")
                continue
            if not anchor:
                continue
            if resolved.suffix != ".md" or resolved not in tracked:
                found.append(f"{where}: an anchor into something that is not Markdown")
                continue
            if resolved not in texts:
                continue  # not among the files checked: cannot see its headings
            if anchor not in anchors(texts[resolved]):
                found.append(f"{where}: {resolved} has no heading with the anchor #{anchor}")
    return found


def _normalise(path: PurePosixPath) -> PurePosixPath | None:
    """``path`` with ``.`` and ``..`` resolved; None if it climbs out of the root."""
    parts: list[str] = []
    for part in path.parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return PurePosixPath(*parts)
