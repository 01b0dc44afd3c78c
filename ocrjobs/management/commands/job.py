"""``manage.py job cancel|retry JOB_ID … [--user NAME]``: the job page's actions from a shell,
through the same services, each leaving an audit entry."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from fleetadmin.errors import DomainError
from ocrjobs.models import Job
from ocrjobs.services import jobs as job_services
from pods.audit import add_actor_argument, cli_actor


class Command(BaseCommand):
    help = "Cancel jobs, or retry their failed pages and documents (recorded in the audit record)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("cancel", "retry"))
        parser.add_argument("job_ids", nargs="+", type=int)
        add_actor_argument(parser)

    def handle(self, *args, action: str, job_ids: list[int], user: str | None, **options):
        actor = cli_actor(user)
        for job_id in job_ids:
            job = Job.objects.filter(pk=job_id).first()
            if job is None:
                raise CommandError(f"no job {job_id}")
            if action == "cancel":
                job = job_services.job_cancel(job=job, actor=actor)
                self.stdout.write(f"job {job.pk}: {job.status}")
                continue
            try:
                pages, documents = job_services.job_retry(job=job, actor=actor)
            except DomainError as exc:
                raise CommandError(f"job {job.pk}: {exc.message}") from None
            self.stdout.write(f"job {job.pk}: {pages} pages and {documents} documents queued again")
