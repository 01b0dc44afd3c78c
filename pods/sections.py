"""The dashboard's sections rendered from their data, each only when its data changed.

Every section that costs something to render has a fingerprint: the values its template
shows, read from the context before rendering. Its HTML is kept under that fingerprint, so a
section whose data did not change since any earlier render costs the fingerprint, not a
render (the broadcaster renders once a second, mostly the same pools, pods and jobs). The
clock is part of a fingerprint wherever a template shows a time relative to it.

The charts section is made of its two figures, each kept on its own. The jobs table is made
of rows rendered one by one, each kept under its own fingerprint. Its section carries them
(``RowsSection``), so that the broadcaster can send a client only the rows that changed, each
as an out-of-band ``<tr>``, when the table holds the same jobs in the same order as the
client's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import mark_safe

# Enough for every row and section of a few hundred connected users' dashboards; the oldest
# used go first (a jobs table is ~20 KB, a row ~1 KB, and a changed one is a new entry).
KEPT_BYTES = 8 * 1024 * 1024

_kept: OrderedDict[tuple, str] = OrderedDict()
_kept_bytes = 0
_lock = threading.Lock()  # the broadcaster's thread and request threads render side by side


class RowsSection(str):
    """A section's HTML that also knows its rows: {row id: row HTML}, in order, and its
    ``frame``, what the section shows besides the rows (here: which rows, in which order)."""

    rows: dict[str, str]
    frame: tuple

    def __new__(cls, html: str, *, rows: dict[str, str], frame: tuple) -> RowsSection:
        section = super().__new__(cls, html)
        section.rows = rows
        section.frame = frame
        return section


def out_of_band(row: str) -> str:
    """A row as an out-of-band swap of its own: the same ``<tr id=…>`` with ``hx-swap-oob``.
    (Inside its section a row must not carry it: htmx would swap it out on its own.)"""
    return row.replace("<tr ", '<tr hx-swap-oob="true" ', 1)


def forget() -> None:
    """Drop every kept rendering (tests; a template changed)."""
    global _kept_bytes
    with _lock:
        _kept.clear()
        _kept_bytes = 0


def _rendered(template: str, fingerprint: tuple, context: Callable[[], dict] | dict) -> str:
    global _kept_bytes
    key = (template, fingerprint)
    with _lock:
        html = _kept.get(key)
        if html is not None:
            _kept.move_to_end(key)
            return html
    html = render_to_string(template, context() if callable(context) else context)
    with _lock:
        if key not in _kept:
            _kept[key] = html
            _kept_bytes += len(html)
        while _kept_bytes > KEPT_BYTES:
            _kept_bytes -= len(_kept.popitem(last=False)[1])
    return html


# --- what each section shows ---------------------------------------------------------------------


def _pools_fingerprint(context: dict) -> tuple:
    staff = bool(context.get("is_staff"))
    pools = tuple(
        (p["key"], p["name"], p["provider"], p["min_pods"], p["max_pods"], p["lanes_per_pod"],
         tuple(sorted(p["pods"].items())), p["lanes"]["used"], p["lanes"]["total"], p["lanes_percent"], p["backlog"],
         p["pages_per_s"], p["dollars_per_hour"], p["spend_today"],
         tuple((a["kind"], a["message"]) for a in p["alerts"]) if staff else ())
        for p in context["pools"]
    )  # fmt: skip
    return staff, pools, tuple(sorted(context["totals"].items()))


def chart_figures(context: dict) -> dict[str, str]:
    """{"pages", "dollars"}: each chart's figure, rendered only when its bars changed (the $/h
    chart seldom does; the pages/s one does while pages flow)."""
    charts, figures = context["charts"], {}
    for name in ("pages", "dollars"):
        fingerprint = (
            repr(charts[name]),
            charts["start_label"],
            context["totals"]["pages_per_s"] if name == "pages" else 0,
        )
        figures[name] = mark_safe(_rendered(f"partials/dash_chart_{name}.html", fingerprint, context))
    return figures


def _pods_fingerprint(context: dict) -> tuple:
    return context["totals"]["pods"], repr(context["pod_summary"])


def _boots_fingerprint(context: dict) -> tuple:
    rows = tuple(
        (
            a.pk,
            a.created_at,
            a.pod.name,
            a.pod.pool.key,
            a.candidate,
            a.outcome,
            a.seconds,
            a.error,
            getattr(a, "ready_after_s", None),
            a.pod.state,
        )
        for a in context["boots"]
    )
    return timezone.localdate(), rows  # a time of day today, a date before


FINGERPRINTS: dict[str, Callable[[dict], tuple]] = {
    "boots": _boots_fingerprint,
    "pools": _pools_fingerprint,
    "pods": _pods_fingerprint,
}


def _job_row_fingerprint(p, *, staff: bool, today) -> tuple:
    job = p.job
    return (staff, today, job.pk, job.status, job.owner.username if staff and job.owner_id else "", job.pool.key,
            job.created_at, p.expected, p.done, p.failed, p.running, p.percent, p.pages_per_s, p.eta_s, p.cost)  # fmt: skip


def job_rows(jobs: list, *, staff: bool) -> dict[str, str]:
    """{"job-<id>": its ``<tr>``} of the jobs shown, each rendered only when what it shows changed."""
    today = timezone.localdate()  # a row shows its time of day today, its date before
    rows = {}
    for p in jobs:
        fingerprint = _job_row_fingerprint(p, staff=staff, today=today)
        rows[f"job-{p.job.pk}"] = _rendered("partials/dash_job_row.html", fingerprint, {"p": p, "is_staff": staff})
    return rows


def render_section(name: str, context: dict) -> str:
    template = f"partials/dash_{name}.html"
    if name == "jobs":
        staff = bool(context.get("is_staff"))
        rows = job_rows(context["jobs"], staff=staff)
        frame = (staff, tuple(rows))
        html = _rendered(template, ("frame", *frame, tuple(rows.values())),
                         lambda: {**context, "job_rows": [mark_safe(row) for row in rows.values()]})  # fmt: skip
        return RowsSection(html, rows=rows, frame=frame)
    if name == "charts":
        return render_to_string(template, {"chart_figures": chart_figures(context)})
    fingerprint = FINGERPRINTS.get(name)
    if fingerprint is None:  # small, or showing the clock: rendered each time
        return render_to_string(template, context)
    return _rendered(template, fingerprint(context), context)


def render_sections(names: tuple[str, ...], context: dict) -> dict[str, str]:
    return {name: render_section(name, context) for name in names}
