"""The job page, live (issue 42): its progress, actions, documents (their outputs), timeline and
the viewer's pages, pushed as they change over the dashboard's websocket machinery.

The front's broadcaster (pods/broadcast.py) runs this feed from its own loop, at most once per
JOB_PUSH_SECONDS whatever the rate of pages: a job's page costs the page pipeline nothing (no
write on a page's path tells anybody; the feed reads what changed). Each pass reads, for each job
someone watches, a fingerprint (a handful of aggregates over the job's rows); only a job whose
fingerprint moved is rendered, once for all its watchers (its group), and only the viewer pages a
watcher holds (reported by the page: static/job.js) whose state moved are sent to that watcher.

The same partial templates serve the first render (ocrjobs/views.py ``job_detail``), the
no-websocket poll (``job_progress``) and every push.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import Count, Max, Q, Sum
from django.template.loader import render_to_string
from django.utils import timezone

from ocrjobs import selectors
from ocrjobs.models import Document, Job, Page, SearchablePdf, page_status_filters
from ocrjobs.selectors import JobProgress
from ocrjobs.selectors.timeline import job_timeline
from ocrjobs.services.outputs import WITH_OUTPUTS
from ocrjobs.viewer import VIEWER_BATCH, viewer_batch, viewer_counts, viewer_page
from pods.broadcast import PROCESS_ID, Subscriber, run_in_render_thread
from pods.services.forecast import job_forecast_again
from pods.spend import jobs_spend

log = logging.getLogger(__name__)

JOB_PUSH_SECONDS = 1.0  # at most one pass (and one push per job) this often
TICK_JITTER_SECONDS = 0.1  # the broadcaster's ticks (1 s) come a little early or late
# A pass takes at most a quarter of the broadcaster's thread (which renders the dashboard too):
# the next one waits four times as long as this one took. On a shared 2-core machine, SQLite, a
# watched job of 30,000 pages costs 40-60 ms a pass when nothing moved (its fingerprint) and
# 160-190 ms when it moved (its page counts by status and by document, as the page's first render
# reads them): pushed every ~0.7 s of work... so every 1 s, and never more than every 4 × a pass.
PASS_SHARE_INVERSE = 4
HELD_PAGES_MAX = 2000  # pages a watcher may hold live (80 batches of the viewer)
MESSAGE_BYTES_MAX = 64 * 1024

GROUP_SECTIONS = ("progress", "escalations", "documents", "events")
GROUP_PARTS = {name: f"partials/job_{name}.html" for name in GROUP_SECTIONS} | {"counts": "partials/viewer_counts.html"}


def group_for_job(job_id: int) -> str:
    return f"job.{PROCESS_ID}.{job_id}"


# --- what the page shows ---------------------------------------------------------------------------


def forecast_vs_actual(job: Job, counts: dict) -> dict | None:
    """The job's pool's forecast for its priority next to what it has taken so far."""
    pools = (job.forecast or {}).get("pools") or []
    if not pools:
        return None
    sizing = pools[0]["sizings"].get(job.priority) or pools[0]["sizings"].get("balanced")
    end = job.finished_at or timezone.now()
    again = job_forecast_again(job)
    return {
        "sizing": job.priority,
        "forecast": sizing,
        "guessed": pools[0].get("guessed", []),  # what the forecast at submission rested on a guess for
        "again": (again["sizings"].get(job.priority) or again["sizings"].get("balanced")) if again else None,
        "pages_forecast": job.forecast.get("pages"),
        "minutes": round((end - job.created_at).total_seconds() / 60, 2),
        "dollars": float(jobs_spend([job.pk])[job.pk]),
        "pods": job.pages.exclude(pod=None).values("pod").distinct().count(),
        "pages_done": counts["done"],
    }


def job_context(job: Job, *, sections: tuple[str, ...] = GROUP_SECTIONS, counts: dict | None = None) -> dict:
    """What the job page's live sections show (``sections``: only what those need; ``counts``:
    the job's page counts, read already by ``job_fingerprint``)."""
    counts = page_counts(job) if counts is None else counts
    documents = selectors.documents_for_job_page(job)
    progress = JobProgress(
        job=job, expected=sum(d.page_count for d in documents), done=counts["done"], failed=counts["failed"],
        cancelled=counts["cancelled"], running=counts["running"], pending=counts["pending"], pages_per_s=0,
        failed_documents=sum(d.status == Document.Status.FAILED for d in documents),
    )  # fmt: skip
    context = {"job": job, "progress": progress, "counts": counts, "documents": documents,
               "outputs_statuses": WITH_OUTPUTS, "viewer_counts": {"total": counts["total"], "to_check": counts["to_check"]}}  # fmt: skip
    if "progress" in sections:
        context["forecast_vs_actual"] = forecast_vs_actual(job, counts)
    if "escalations" in sections:
        context["escalated_count"], context["escalations"] = selectors.job_escalations(job)
    if "events" in sections:
        context["deliveries"] = list(job.webhook_deliveries.all())
        context["timeline"] = job_timeline(job, deliveries=context["deliveries"])
    return context


def render_group_sections(context: dict) -> dict[str, str]:
    """The sections every watcher of the job gets, and the viewer's counts."""
    return {name: render_to_string(template, context) for name, template in GROUP_PARTS.items()}


def render_actions(context: dict, *, user_id: int) -> str:
    """The downloads and buttons that fit the job's state, for one user (the rebuild is its owner's).
    Rendered without a request: the forms carry no CSRF field, static/fleetadmin.js adds the page's."""
    return render_to_string("partials/job_actions.html", {**context, "viewer_user_id": user_id})


def _pages_summed(job: Job) -> dict:
    """The job's pages in one aggregate: by status (``page_status_filters``: a page claimed ahead
    waits), with warnings, to check, and attempts."""
    return job.pages.order_by().aggregate(
        total=Count("id"), **{s: Count("id", filter=q) for s, q in page_status_filters().items()},
        warnings=Count("id", filter=Q(status=Page.Status.DONE, warnings__gt=0)), attempts=Sum("attempts"),
        to_check=Count("id", filter=Q(status=Page.Status.DONE, confidence__lt=settings.VIEWER_CONFIDENCE_THRESHOLD)),
    )  # fmt: skip


def page_counts(job: Job) -> dict:
    """``Job.page_counts`` and the viewer's pages to check, in one read."""
    return {key: n for key, n in _pages_summed(job).items() if key != "attempts"}


def job_fingerprint(job: Job) -> tuple[tuple, dict]:
    """What the live sections show, summed: it moves when a page, a document, an output, a webhook
    or an audit entry of the job does. Four aggregates, each one range of an index of the job; and
    the job's page counts (``page_counts``), which the sections show."""
    pages = _pages_summed(job)
    documents = job.documents.order_by().aggregate(
        split=Count("id", filter=Q(status=Document.Status.SPLIT)),
        failed=Count("id", filter=Q(status=Document.Status.FAILED)),
        built=Count("id", filter=Q(searchable_pdf__status=SearchablePdf.Status.BUILT)),
        pdf_failed=Count("id", filter=Q(searchable_pdf__status=SearchablePdf.Status.FAILED)),
        generations=Sum("searchable_pdf__generation"),
        builds=Sum("searchable_pdf__builds"),
        pdf_at=Max("searchable_pdf__updated_at"),
    )
    deliveries = job.webhook_deliveries.order_by().aggregate(
        n=Count("id"), next_at=Max("next_attempt_at"), delivered=Max("delivered_at")
    )
    audits = job.audit_entries.order_by().aggregate(n=Count("id"), last=Max("at"))
    fingerprint = (job.status, job.started_at, job.finished_at, tuple(sorted(pages.items())),
                   tuple(sorted(documents.items())), tuple(sorted(deliveries.items())), tuple(sorted(audits.items())))  # fmt: skip
    counts = {key: n for key, n in pages.items() if key != "attempts"}
    return fingerprint, counts


# --- one pass ------------------------------------------------------------------------------------


@dataclass
class Watch:
    """One job page's websocket: its user, its job, the viewer pages it holds and their states."""

    subscriber: Subscriber
    job_id: int
    pages: dict[int, str] = field(default_factory=dict)
    fill: bool = False  # its viewer is empty (the job was being split): send the first batch
    fresh: bool = True  # reported since the last pass: its pages are checked even if the job did not move


@dataclass
class Pass:
    """What a pass found: each job's fingerprint, the group messages, the messages per channel,
    and the page states each channel now shows."""

    fingerprints: dict[int, tuple] = field(default_factory=dict)
    to_groups: dict[int, str] = field(default_factory=dict)
    to_channels: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    shown: dict[str, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    filled: set[str] = field(default_factory=set)


def _pages_html(job: Job, page_ids: list[int], threshold: float) -> dict[int, str]:
    rows = Page.objects.select_related("document").filter(job=job).in_bulk(page_ids)
    return {
        pk: render_to_string(
            "ocrjobs/viewer_batch.html",
            {
                "job": job,
                "viewer_items": [viewer_page(page, threshold=threshold)],
                "next_offset": None,
                "oob": True,
                "threshold": threshold,
            },
        )  # fmt: skip
        for pk, page in rows.items()
    }


def _fill_html(job: Job, threshold: float) -> tuple[str, dict[int, str]]:
    items, next_offset = viewer_batch(job, threshold=threshold, offset=0, limit=VIEWER_BATCH)
    context = {"job": job, "viewer_items": items, "next_offset": next_offset, "batch": VIEWER_BATCH,
               "threshold": threshold, "viewer_counts": viewer_counts(job, threshold=threshold)}  # fmt: skip
    html = render_to_string("ocrjobs/viewer_pages.html", {**context, "oob": True})
    return html, {item.page.pk: item.page.live_state for item in items}


def job_pass(watches: dict[str, Watch], last: dict[int, tuple]) -> Pass:
    """One pass over the watched jobs (on the broadcaster's render thread): ``last`` is each job's
    fingerprint as last pushed (absent: push everything)."""
    found = Pass()
    threshold = settings.VIEWER_CONFIDENCE_THRESHOLD
    by_job: dict[int, dict[str, Watch]] = defaultdict(dict)
    for channel, watch in watches.items():
        by_job[watch.job_id][channel] = watch
    for job_id, watching in by_job.items():
        job = Job.objects.select_related("pool", "owner").filter(pk=job_id).first()
        if job is None:
            continue
        fingerprint, counts = job_fingerprint(job)
        found.fingerprints[job_id] = fingerprint
        moved = fingerprint != last.get(job_id)
        if moved:
            context = job_context(job, counts=counts)
            found.to_groups[job_id] = "".join(render_group_sections(context).values())
            actions = {}
            for channel, watch in watching.items():
                user_id = watch.subscriber.user_id
                if user_id not in actions:
                    actions[user_id] = render_actions(context, user_id=user_id)
                found.to_channels[channel].append(actions[user_id])
        checked = {channel: watch for channel, watch in watching.items() if moved or watch.fresh}
        held = {pk for watch in checked.values() for pk in watch.pages}
        now = {}
        if held:
            rows = Page.objects.filter(job_id=job_id, pk__in=held).values_list(
                "pk", "status", "attempts", "escalated_from_id"
            )
            now = {pk: Page.state_of(status, attempts, escalated) for pk, status, attempts, escalated in rows}  # fmt: skip
        moved_pages = {
            pk for watch in checked.values() for pk, state in watch.pages.items() if now.get(pk, state) != state
        }
        pages_html = _pages_html(job, sorted(moved_pages), threshold) if moved_pages else {}
        for channel, watch in checked.items():
            for pk, state in watch.pages.items():
                if pk in pages_html and now.get(pk, state) != state:
                    found.to_channels[channel].append(pages_html[pk])
                    found.shown[channel][pk] = now[pk]
            if watch.fill and not watch.pages and job.pages.exists():
                html, states = _fill_html(job, threshold)
                found.to_channels[channel].append(html)
                found.shown[channel].update(states)
                found.filled.add(channel)
    return found


# --- the feed the broadcaster runs ---------------------------------------------------------------


def parse_report(text: str | None) -> tuple[dict[int, str], bool] | None:
    """What a job page says it holds: {"pages": {id: state}, "fill": bool}; None if malformed."""
    if not text or len(text) > MESSAGE_BYTES_MAX:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    if not isinstance(report, dict) or not isinstance(report.get("pages", {}), dict):
        return None
    pages = {}
    for key, state in list(report.get("pages", {}).items())[:HELD_PAGES_MAX]:
        if isinstance(key, str) and key.isdigit() and len(key) < 19 and isinstance(state, str) and len(state) < 40:
            pages[int(key)] = state
    return pages, report.get("fill") is True


class JobFeed:
    """The job pages this front serves: who watches which job, and a pass every JOB_PUSH_SECONDS."""

    def __init__(self) -> None:
        self.watches: dict[str, Watch] = {}
        self.last: dict[int, tuple] = {}
        self.next_at = 0.0

    def watching(self) -> bool:
        return bool(self.watches)

    def subscribers(self) -> dict[str, Subscriber]:
        return {channel: watch.subscriber for channel, watch in self.watches.items()}

    def watch(self, channel_name: str, subscriber: Subscriber, job_id: int) -> None:
        self.watches[channel_name] = Watch(subscriber=subscriber, job_id=job_id)
        # The newcomer's page may be older than the last push: its job's group gets everything.
        self.last.pop(job_id, None)

    def hold(self, channel_name: str, pages: dict[int, str], fill: bool) -> None:
        watch = self.watches.get(channel_name)
        if watch is None:
            return
        changed = {pk: state for pk, state in pages.items() if watch.pages.get(pk) != state}
        room = HELD_PAGES_MAX - len(watch.pages)
        watch.pages.update(dict(list(changed.items())[: max(0, room)]))
        watch.fill = fill
        watch.fresh = watch.fresh or bool(changed) or fill

    def groups(self) -> dict[str, str]:
        return {channel: group_for_job(watch.job_id) for channel, watch in self.watches.items()}

    def unwatch(self, channel_name: str) -> None:
        watch = self.watches.pop(channel_name, None)
        if watch is not None and not any(w.job_id == watch.job_id for w in self.watches.values()):
            self.last.pop(watch.job_id, None)

    async def tick(self, layer, *, now: float) -> None:
        if not self.watches or now < self.next_at:
            return
        watches = {channel: Watch(w.subscriber, w.job_id, dict(w.pages), w.fill, w.fresh)
                   for channel, w in self.watches.items()}  # fmt: skip
        for watch in self.watches.values():
            watch.fresh = False
        started = time.monotonic()
        found = await run_in_render_thread(job_pass, watches, dict(self.last))
        took = time.monotonic() - started
        self.next_at = now + max(JOB_PUSH_SECONDS, PASS_SHARE_INVERSE * took) - TICK_JITTER_SECONDS
        self.last.update(found.fingerprints)
        for job_id, html in found.to_groups.items():
            await layer.group_send(group_for_job(job_id), {"type": "job.html", "html": html})
        for channel, parts in found.to_channels.items():
            watch = self.watches.get(channel)
            if watch is None:
                continue  # left while we rendered
            watch.pages.update(found.shown.get(channel, {}))
            if channel in found.filled:
                watch.fill = False
            await layer.send(channel, {"type": "job.html", "html": "".join(parts)})
