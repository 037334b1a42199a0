"""The docs against the code, for the kinds of drift a machine can see: links and anchors
that lead nowhere, a command, a setting or a table the code has and the docs leave out
(or the other way round). What a sentence claims still needs a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.apps import apps

from django_tasks_plus import conf

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
COMMANDS = REPO / "django_tasks_plus" / "management" / "commands"

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _without_code_blocks(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: markup dropped, lower case, punctuation
    but ``-`` and ``_`` removed, each space a ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


EXPLICIT_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def anchors(page: Path) -> set[str]:
    """Every anchor of a page: its headings' (a repeated heading gets ``-1``, ``-2``… as on
    GitHub) and its explicit ``<a id="…">`` ones (for a paragraph that is not a heading)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _without_code_blocks(page.read_text()):
        found.update(EXPLICIT_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slugs_follow_github():
    assert slug("`runtasks --reload` (development only)") == "runtasks---reload-development-only"
    assert slug("Django 5.2 and the backport") == "django-52-and-the-backport"
    assert slug("Doer specifications (`DOER`, `QUEUES_CONFIG`)") == (
        "doer-specifications-doer-queues_config"
    )


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or anchor does not exist."""
    problems = []
    for line in _without_code_blocks(page.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _hash, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                problems.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{page.name}: {target} (no such heading)")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_anchor_resolves(page: Path):
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path):
    (tmp_path / "other.md").write_text(
        '# Other page\n\n## A section\n\n<a id="named"></a>**Named** paragraph.\n'
    )
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-section) [self](#page) [web](https://example.com/x)\n"
        "[explicit](other.md#named)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nowhere (no such heading)",
    ]


def test_the_index_links_every_page():
    index = (DOCS / "index.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(index)}
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert pages - linked == set()


def _section(page: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if (m := HEADING.match(lines[i])) and len(m.group(1)) <= level
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


def _table_cells(text: str, column: int = 0) -> list[str]:
    """One column of every Markdown table row in ``text`` (header and rule left out)."""
    cells = []
    for line in text.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells.append(line.strip("|").split("|")[column].strip())
    return cells[1:] if cells else []


def test_the_operations_command_table_lists_every_management_command():
    commands = sorted(p.stem for p in COMMANDS.glob("*.py") if not p.stem.startswith("_"))
    page = _section(DOCS / "operations.md", "# Operating the queue from the command line")
    first_table = page.split("\n\n## ")[0]
    listed = {
        match.group(1)
        for cell in _table_cells(first_table)
        if (match := re.match(r"`manage\.py (\w+)", cell))
    }
    assert listed == set(commands)


def test_every_make_target_is_in_make_help_and_the_development_page():
    """What ``.PHONY`` declares is what ``make help`` prints (``help`` itself aside) and
    the development page's table of targets lists, and nothing more."""
    makefile = (REPO / "Makefile").read_text()
    declared = set(re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE).group(1).split())  # type: ignore[union-attr]
    helped = set(re.findall(r'^\t@echo "make (\S+)', makefile, re.MULTILINE))
    page = _section(DOCS / "development.md", "## Make targets")
    listed = {
        m.group(1) for cell in _table_cells(page) if (m := re.fullmatch(r"`make ?(\S*)`", cell))
    }
    assert helped == declared - {"help"}
    assert listed == declared


def test_every_option_is_documented_in_the_settings_reference():
    """Each ``OPTIONS`` key the backend accepts has its own heading in settings.md, and
    each ``METRICS`` key a row; no heading names a key the backend refuses."""
    settings_page = DOCS / "settings.md"
    options = _section(settings_page, "## `OPTIONS`")
    documented = {
        m.group(1) for line in options.splitlines() if (m := re.match(r"^### `(\w+)`$", line))
    }
    assert documented == set(conf._DEFAULTS)
    metrics = _section(settings_page, "### `METRICS`")
    rows = {cell.strip("`") for cell in _table_cells(metrics)}
    assert rows == set(conf._METRICS_DEFAULTS)


def test_the_installation_page_lists_every_table_the_migrations_create():
    text = _section(DOCS / "installation.md", "## Migrations and tables")
    listed = {cell.strip("`") for cell in _table_cells(text)}
    models = apps.get_app_config("django_tasks_plus").get_models()
    tables = {model._meta.db_table for model in models}
    assert listed == tables
    count = re.search(r"The migrations create (\w+) tables", text)
    assert count is not None, "say how many tables the migrations create"
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    words += ("ten", "eleven", "twelve")
    assert words.index(count.group(1)) == len(tables)
