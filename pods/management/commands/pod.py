"""``manage.py pod release|terminate POD_ID … [--user NAME] [--reason TEXT]``: the dashboard's
and the pod admin's actions from a shell, through the same services, each leaving an audit entry."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pods.audit import add_actor_argument, cli_actor
from pods.models import Pod
from pods.services import lifecycle


class Command(BaseCommand):
    help = "Release or terminate pods by id (recorded in the audit record)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("release", "terminate"))
        parser.add_argument("pod_ids", nargs="+", type=int)
        add_actor_argument(parser)
        parser.add_argument("--reason", default="")

    def handle(self, *args, action: str, pod_ids: list[int], user: str | None, reason: str, **options):
        actor = cli_actor(user)
        service = lifecycle.pod_release if action == "release" else lifecycle.pod_terminate
        for pod_id in pod_ids:
            pod = Pod.objects.select_related("pool").filter(pk=pod_id).first()
            if pod is None:
                raise CommandError(f"no pod {pod_id}")
            acted = service(pod=pod, reason=reason or f"shell: {actor.name}", actor=actor)
            self.stdout.write(f"{pod.name}: {action + 'd' if acted else 'nothing to ' + action}")
