"""Submit files to the running fleetadmin, follow the job, write one .txt per document.

Exit codes: 0 every page has text; 1 some pages or documents failed (the text
of the others is written); 2 bad input (nothing was submitted); 4 gave up
waiting (the job goes on; its id is printed).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from django.core.management.base import BaseCommand

from fleetadmin.api import ApiError
from ocrjobs import selectors
from ocrjobs.models import Job
from ocrjobs.services.schedule import resolve_schedule
from ocrjobs.services.submission import Upload, job_submit

EXIT_OK, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_TIMEOUT = 0, 1, 2, 4


class Command(BaseCommand):
    help = "OCR PDF and image files with the running fleetadmin and write one .txt per document."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument("--pool", help="pool key (default: the first pool)")
        parser.add_argument("--out", default=".", help="directory for the .txt files (default: here)")
        parser.add_argument("--languages", default="eng")
        parser.add_argument("--max-dollars", help="budget: no pod is booted for its pages once the job has cost this")
        parser.add_argument("--deadline", help="ISO 8601 with a time zone, e.g. 2026-12-01T14:00:00Z")
        parser.add_argument("--priority", choices=["fastest", "balanced", "cheapest"], help="when there is no deadline")
        parser.add_argument("--timeout", type=float, default=0, help="seconds to wait; 0 waits for ever")

    def handle(self, *args, files, pool, out, languages, timeout, max_dollars, deadline, priority, **options):
        out_dir = Path(out)
        uploads = []
        try:
            for name in files:
                path = Path(name)
                if not path.is_file():
                    raise ApiError(f"{name}: no such file")
                uploads.append(Upload(name=path.name, file=path.open("rb")))
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # Found before submitting, so that no job runs whose text cannot be written.
                raise ApiError(f"{out}: cannot create the output directory ({exc.strerror})") from None
            schedule = resolve_schedule(max_dollars=max_dollars, deadline=deadline, priority=priority)
            job = job_submit(owner=None, uploads=uploads, pool_key=pool, languages=languages, schedule=schedule)
        except ApiError as exc:
            self.stderr.write(f"ocr: {exc.message}")
            sys.exit(EXIT_BAD_INPUT)
        finally:
            for upload in uploads:
                upload.file.close()
        self.stderr.write(f"job {job.pk} submitted to pool {job.pool.key}")
        if not self.follow(job, timeout):
            self.stderr.write(f"\nocr: still running after {timeout:.0f} s; follow it at /v1/jobs/{job.pk}")
            sys.exit(EXIT_TIMEOUT)
        job.refresh_from_db()
        written = self.write_texts(job, out_dir)
        counts = job.page_counts()
        self.stderr.write(
            f"job {job.pk} {job.status}: {counts['done']} pages done, {counts['failed']} failed; "
            f"wrote {len(written)} files to {out_dir}"
        )
        sys.exit(EXIT_OK if job.status == Job.Status.DONE else EXIT_PARTIAL)

    def follow(self, job: Job, timeout: float) -> bool:
        """Draw a progress bar until the job finishes; False on time-out."""
        tty = sys.stderr.isatty()
        started = time.monotonic()
        expected = sum(d.page_count for d in job.documents.all())
        last_line = ""
        while True:
            job.refresh_from_db(fields=["status"])
            counts = job.page_counts()
            ended = counts["done"] + counts["failed"] + counts["cancelled"]
            elapsed = time.monotonic() - started
            rate = counts["done"] / elapsed if elapsed > 0 else 0.0
            filled = int(30 * ended / expected) if expected else 0
            line = (
                f"[{'#' * filled}{'.' * (30 - filled)}] {ended}/{expected} pages"
                f" ({counts['failed']} failed) {rate:.1f} pages/s"
            )
            if tty:
                sys.stderr.write("\r" + line)
            elif line != last_line:
                sys.stderr.write(line + "\n")
            last_line = line
            if job.is_finished:
                if tty:
                    sys.stderr.write("\n")
                return True
            if timeout and elapsed > timeout:
                return False
            time.sleep(0.5)

    def write_texts(self, job: Job, out_dir: Path) -> list[Path]:
        written, used = [], set()
        for document in job.documents.all():
            stem = Path(document.name).stem or f"document-{document.position}"
            name, n = f"{stem}.txt", 2
            while name in used:
                name, n = f"{stem}-{n}.txt", n + 1
            used.add(name)
            target = out_dir / name
            partial = target.with_suffix(".txt.partial")
            partial.write_text(selectors.document_text(document))
            partial.replace(target)
            written.append(target)
        return written
