"""What ocrjobs registers with pods at start-up (``OcrjobsConfig.ready``): its pass work, the job
pages' live feed, and its answers to ``pods.hooks`` (pods never imports ocrjobs).

Each hook is the ocrjobs function of the same name, but for the events pods tells:

- ``pod_ready``: a pod joined; if its pool has pages waiting, a dispatcher is started for them;
- ``pod_lost``: ``pages_requeue_from_pod``; ``pod_preempted``: ``pages_requeue_preempted``;
- ``pool_housekeeping``: ``documents_recover`` (splits the broker lost), each pool's tick;
- ``minute_housekeeping``: ``housekeeping_minute`` (staging, kept uploads, lost PDF builds).
"""

from __future__ import annotations

from ocrjobs import selectors
from ocrjobs.live import JobFeed
from ocrjobs.models import WebhookDelivery
from ocrjobs.selectors.budgets import jobs_past_owners_day
from ocrjobs.services import webhooks
from ocrjobs.services.dispatchers import dispatch_ensure, dispatch_for_pod_ready
from ocrjobs.services.escalation_budget import pages_escalated_over_budget
from ocrjobs.services.pages import pages_requeue_from_pod, pages_requeue_preempted
from ocrjobs.services.recover import documents_recover, housekeeping_minute
from pods import hooks
from pods.broadcast import register_feed
from pods.services.passes import Work
from pods.services.passes import register as register_work


def register() -> None:
    # Only claimed and sent to a short task of its own by a pass: a pass never waits on a receiver.
    register_work(Work("webhook", webhooks.deliveries_due, webhooks.delivery_send,
                       waiting=lambda now: WebhookDelivery.objects.due(now=now)))  # fmt: skip
    # The job pages, pushed from the front's broadcaster loop (the dashboard's).
    register_feed(JobFeed)
    hooks.register(JOBS)


JOBS = hooks.Jobs(
    pages_waiting=selectors.pages_waiting,
    pool_backlog=selectors.pool_backlog,
    pool_pages_not_split=selectors.pool_pages_not_split,
    pools_pages_ahead=selectors.pools_pages_ahead,
    pool_seconds_per_page=selectors.pool_seconds_per_page,
    pool_escalated_share=selectors.pool_escalated_share,
    pool_scheduled_jobs=selectors.pool_scheduled_jobs,
    pool_last_start=selectors.pool_last_start,
    pods_with_pages_running=selectors.pods_with_pages_running,
    budgeted_jobs_waiting=selectors.budgeted_jobs_waiting,
    jobs_past_owners_day=jobs_past_owners_day,
    pools_pages=selectors.pools_pages,
    pools_page_totals=selectors.pools_page_totals,
    pages_at_pods=selectors.pages_at_pods,
    pages_in_flight_by_pod=selectors.pages_in_flight_by_pod,
    dispatchers_live=selectors.dispatchers_live,
    busy_seconds=selectors.busy_seconds,
    jobs_visible_to=selectors.jobs_visible_to,
    jobs_for_dashboard=selectors.jobs_for_dashboard,
    job_progress=selectors.job_progress,
    pages_done_by_minute=selectors.pages_done_by_minute,
    pages_done_in_minutes=selectors.pages_done_in_minutes,
    pod_ready=dispatch_for_pod_ready,
    pod_lost=pages_requeue_from_pod,
    pod_preempted=pages_requeue_preempted,
    dispatch_ensure=dispatch_ensure,
    pages_escalated_over_budget=pages_escalated_over_budget,
    pool_housekeeping=documents_recover,
    minute_housekeeping=housekeeping_minute,
)
