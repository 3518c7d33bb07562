# SPDX-License-Identifier: Apache-2.0
"""Rendering of `noisyneighbor top`: one renderer per view over shared cell formatting and table layout.

Renderers take the sections built by `noisyneighbor.sections` and return rich renderables; they
compute nothing but text. The same output serves the live terminal and plain, piped tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from noisyneighbor.sections import (
    ALL_VIEWS,
    VIEW_SOURCES,
    VIEWS,
    PsiSection,
    sort_table_rows,
)
from probes.engine import ProbeStatus
from probes.plugin import TopColumn, TopTable
from probes.registry import PLUGINS
from probes.units import fmt_bytes, fmt_ms, fmt_num, fmt_pct, fmt_rate, fmt_us

if TYPE_CHECKING:
    # rich is imported where a frame is rendered: the agent imports this module for the view names and
    # keys (its command line, /top?format=keys) and renders only for a client's /top (~4 MiB of RSS).
    from rich.console import Group, RenderableType
    from rich.table import Table
    from rich.text import Text

# Plugins whose view is a declared table (ProbePlugin.top_table): view -> its table.
_TABLES: dict[str, TopTable] = {p.top_view: p.top_table for p in PLUGINS if p.top_view and p.top_table}

VIEW_TITLES = {
    "psi": "pressure (PSI) and CPU throttling",
    **{view: table.title for view, table in _TABLES.items()},
}
# Interactive keys: a view's letter (its declared table's hotkey), then the tables' sort keys.
_VIEW_KEYS = {**{table.hotkey: view for view, table in _TABLES.items() if table.hotkey}, "p": "psi"}
VIEW_HOTKEYS = {**_VIEW_KEYS, "a": "all"}
SORT_HOTKEYS = {key: option for table in _TABLES.values() for key, option in table.sort_hotkeys.items()}


def _hint(key: str, view: str) -> str:
    """`[g]pu`: the view's name with its key bracketed (or the key before it when the name lacks it)."""
    i = view.find(key)
    return f"{view[:i]}[{key}]{view[i + 1:]}" if i >= 0 else f"[{key}] {view}"


_KEY_OF_VIEW = {view: key for key, view in _VIEW_KEYS.items()}
KEYS_HINT = (
    "views: "
    + "".join(f"{_hint(_KEY_OF_VIEW[view], view)} " for view in dict.fromkeys((*ALL_VIEWS, *VIEWS)) if view in _KEY_OF_VIEW)
    + "[a]ll   "
    + "".join(f"{view} sort: " + " ".join(_hint(key, option) for key, option in table.sort_hotkeys.items()) + "   "
              for view, table in _TABLES.items() if table.sort_hotkeys)
    + "[q]uit"
)


# -- cell formatting -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    cell: Callable[[Any], str]
    sort_key: str | None = None  # marked ▼ when the rows are sorted by it
    flex: bool = False  # takes the width left over, ellipsized (names, destination lists)
    left: bool = False


def make_table(
    columns: Sequence[Column], rows: Sequence[Any], limit: int | None, sorted_by: str | None = None, expand: bool = True
) -> Table:
    from rich.table import Table

    table = Table(expand=expand, box=None, header_style="bold", pad_edge=False)
    for c in columns:
        title = c.title + ("▼" if c.sort_key is not None and c.sort_key == sorted_by else "")
        if c.flex:
            table.add_column(title, overflow="ellipsis", no_wrap=True, ratio=1)
        else:
            table.add_column(title, justify="left" if c.left else "right", no_wrap=True)
    for row in rows[:limit] if limit else rows:
        table.add_row(*(c.cell(row) for c in columns))
    return table


def _dim(text: str) -> Text:
    from rich.text import Text

    return Text(text, style="dim")


def _table(columns: Sequence[Column], rows: Sequence[Any], limit: int | None, sorted_by: str | None,
           nothing: str) -> list[RenderableType]:
    """The table, and when it has no row a line saying so: an idle probe is not a broken one."""
    table = make_table(columns, rows, limit, sorted_by)
    return [table] if rows else [table, _dim(f"nothing this interval: {nothing}")]


def _drops(drops: dict[str, int]) -> str:
    return f"drops: {sum(drops.values())}"


NAME = Column("CGROUP / POD", lambda r: r["name"], flex=True)
QOS = Column("QOS", lambda r: r["qos"] or "-", left=True)


# -- one renderer per view -------------------------------------------------------------------------


def _node_psi_cell(kind: str) -> Callable[[tuple[str, dict]], str]:
    return lambda item: fmt_pct(item[1].get(kind)) if item[1]["available"] else "-"


NODE_PSI_COLUMNS = (
    Column("NODE PSI", lambda item: item[0], left=True),
    Column("SOME", _node_psi_cell("some_pct")),
    Column("FULL", _node_psi_cell("full_pct")),
    Column("SOME avg10", _node_psi_cell("some_avg10")),
    Column("FULL avg10", _node_psi_cell("full_avg10")),
)


def _cgroup_psi(resource: str) -> Callable[[dict], str]:
    def cell(r: dict) -> str:
        psi = (r["psi"] or {}).get(resource)
        return "n/a" if psi is None else fmt_pct(psi["some_pct"])

    return cell


def render_psi(section: PsiSection, limit: int | None, sort_key: str) -> list[RenderableType]:
    missing = [f"{resource} unavailable: {row['reason'].removeprefix(resource + ': ')}"
               for resource, row in section.node.items() if not row["available"]]
    parts: list[RenderableType] = [
        make_table(NODE_PSI_COLUMNS, list(section.node.items()), None, expand=False),
        *(_dim(line) for line in missing),
        make_table(PSI_CGROUP_COLUMNS, section.cgroups, limit, "throttled"),
        _dim(
            "% of wall time stalled over the interval (Δtotal); THROTTLED: share of CFS periods throttled; "
            "cgroup PSI is 'some'"
        ),
        _dim(f"per-cgroup PSI: {section.cgroup_psi_scope}"),
    ]
    if section.note:
        parts.append(_dim(section.note))
    return parts


# How a declared table's column shows its value (TopColumn.unit).
_UNIT_CELLS: dict[str, Callable[[Any], str]] = {
    "text": lambda v: "-" if v is None or v == "" else str(v),
    "count": lambda v: "-" if v is None else f"{v:.0f}",
    "rate": fmt_rate,
    "bytes": fmt_bytes,
    "ms": fmt_ms,
    "us": fmt_us,
    "pct": fmt_pct,
}


def _cell(c: TopColumn) -> Callable[[dict], str]:
    if c.text is not None:
        return c.text
    unit = _UNIT_CELLS[c.unit]

    def cell(r: dict) -> str:
        if c.when is not None and not r.get(c.when):
            return "-"
        value = r.get(c.key)
        if value is not None and c.scale != 1.0:
            value = value * c.scale
        if c.exact is not None:
            return fmt_us(value, bool(r.get(c.exact)))
        return unit(value)

    return cell


def _table_column(c: TopColumn) -> Column:
    marker = c.sort if c.sort is not None else (c.key if c.sorted_by else None)
    return Column(c.title, _cell(c), marker, flex=c.flex, left=c.unit == "text" if c.left is None else c.left)


def _psi_cell(c: TopColumn, psi_key: str) -> Callable[[dict], str]:
    """A listing view's column in psi's rows, where its value is under ``psi_key``."""
    cell = _cell(replace(c, key=psi_key, sort=None, sorted_by=False))
    return cell


PSI_CGROUP_COLUMNS = (
    NAME,
    QOS,
    Column("CORES", lambda r: fmt_num(r["cores"])),
    Column("QUOTA", lambda r: fmt_num(r["quota_cores"]) if r["quota_cores"] else "none"),
    Column("THROTTLED", lambda r: fmt_pct(r["throttled_pct"]), "throttled"),
    Column("THR/s", lambda r: fmt_ms(r["throttled_ms_per_s"])),
    # what the views listing the cgroups show of them (TopTable.psi_cgroups), titled by their view
    *(Column(f"{view.upper()} {c.title}", _psi_cell(c, table.psi_cgroups[c.key]))
      for view, table in _TABLES.items() if table.psi_cgroups for c in table.columns if c.key in table.psi_cgroups),
    Column("CPU PSI", _cgroup_psi("cpu")),
    Column("MEM PSI", _cgroup_psi("memory")),
    Column("IO PSI", _cgroup_psi("io")),
)


def table_renderer(table: TopTable) -> Callable[[dict, int | None, str], list[RenderableType]]:
    """The renderer of a plugin's declared table: the cgroup's name and QoS (unless its rows name no
    cgroup), its columns, then its footer line and the probe's drops."""
    names = (Column(table.name_title, lambda r: r["name"], flex=True), QOS) if table.name_title else ()
    columns = (*names, *(_table_column(c) for c in table.columns))
    fixed = next((c.key for c in table.columns if c.sorted_by), None)

    def render(section: dict, limit: int | None, sort_key: str) -> list[RenderableType]:
        rows, sorted_by = section[table.rows_key], fixed
        if table.sort_keys:
            sorted_by = sort_key if sort_key in table.sort_keys else next(iter(table.sort_keys))
            rows = sort_table_rows(rows, table, sorted_by)
        footer = table.footer(section) if table.footer is not None else ""
        drops = _drops(section["drops"])
        return [*_table(columns, rows, limit, sorted_by, table.nothing),
                _dim(f"{footer}   {drops}" if footer else drops)]

    return render


RENDERERS: dict[str, Callable[[Any, int | None, str], list[RenderableType]]] = {
    "psi": render_psi,
    **{view: table_renderer(table) for view, table in _TABLES.items()},
}


# -- a whole frame ---------------------------------------------------------------------------------


def render_view(
    view: str, section: Any, statuses: dict[str, ProbeStatus], limit: int | None, sort_key: str
) -> list[RenderableType]:
    from rich.text import Text

    lines = "  ".join(statuses[name].line() for name in VIEW_SOURCES[view] if name in statuses)
    title = Text(f"── {view}: {VIEW_TITLES[view]} — {lines}", style="bold")
    if section is None:  # its probe is off: the status in the title says why
        return [title]
    return [title, *RENDERERS[view](section, limit, sort_key)]


def render_frame(
    ts: str, sections: dict[str, Any], views: Sequence[str], statuses: dict[str, ProbeStatus], *,
    sort_key: str = "wait", limit: int | None = None, keys: bool = False,
) -> Group:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = [Text(f"noisyneighbor top — {ts}", style="bold")]
    for view in (v for v in VIEWS if v in views):
        parts.extend(render_view(view, sections.get(view), statuses, limit, sort_key))
    if keys:
        parts.append(_dim(KEYS_HINT))
    return Group(*parts)
