"""Submit files to the running fleetadmin, follow the job, write one file per document and format
(``--format txt,md,pdf,jsonl``; txt by default). A searchable PDF is built by a worker once the
job ends: the command waits for it too.

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
from ocrjobs.models import Document, Job, SearchablePdf
from ocrjobs.services import outputs
from ocrjobs.services.schedule import resolve_schedule
from ocrjobs.services.submission import Upload, job_submit

EXIT_OK, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_TIMEOUT = 0, 1, 2, 4
FORMATS = ("txt", "md", "pdf", "jsonl")


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
        parser.add_argument("--format", default="txt", help=f"what to write per document, comma-separated: "
                            f"{', '.join(FORMATS)} (default txt)")  # fmt: skip

    def handle(self, *args, files, pool, out, languages, timeout, max_dollars, deadline, priority, **options):
        out_dir = Path(out)
        uploads = []
        started = time.monotonic()
        try:
            formats = _formats(options["format"])
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
        if "pdf" in formats and not self.wait_for_pdfs(
            job, timeout and max(0.0, timeout - (time.monotonic() - started))
        ):
            self.stderr.write(f"ocr: the searchable PDFs are still being built; they will be at /v1/jobs/{job.pk}")
            sys.exit(EXIT_TIMEOUT)
        written, missing = self.write_outputs(job, out_dir, formats)
        counts = job.page_counts()
        self.stderr.write(
            f"job {job.pk} {job.status}: {counts['done']} pages done, {counts['failed']} failed; "
            f"wrote {len(written)} files to {out_dir}"
        )
        sys.exit(EXIT_OK if job.status == Job.Status.DONE and not missing else EXIT_PARTIAL)

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

    def wait_for_pdfs(self, job: Job, timeout: float) -> bool:
        """Wait until no searchable PDF of the job is pending or building (a worker builds them);
        False on time-out."""
        started = time.monotonic()
        pending = SearchablePdf.objects.filter(
            document__job=job, status__in=(SearchablePdf.Status.PENDING, SearchablePdf.Status.BUILDING)
        )
        while pending.exists():
            if timeout and time.monotonic() - started > timeout:
                return False
            time.sleep(0.5)
        return True

    def write_outputs(self, job: Job, out_dir: Path, formats: list[str]) -> tuple[list[Path], list[str]]:
        """Each document's files in ``formats`` (written whole, then renamed into place): the files
        written, and what could not be (a searchable PDF that failed or was never asked for)."""
        written, missing = [], []
        documents = list(job.documents.select_related("searchable_pdf").order_by("position"))
        stems = outputs.output_stems(documents)
        for document in documents:
            for fmt in formats:
                target = out_dir / f"{stems[document.pk]}.{fmt}"
                partial = target.with_name(target.name + ".partial")
                if fmt == "pdf":
                    pdf = document.searchable_pdf_or_none
                    if pdf is None or pdf.status != SearchablePdf.Status.BUILT:
                        why = pdf.error if pdf is not None and pdf.error else "no searchable PDF was built"
                        if document.status != Document.Status.FAILED:
                            self.stderr.write(f"ocr: {document.name}: {why}")
                        missing.append(document.name)
                        continue
                    with partial.open("wb") as f:
                        for chunk in outputs.searchable_pdf_chunks(pdf):
                            f.write(chunk)
                else:
                    parts = {"txt": lambda d: [selectors.document_text(d)], "md": outputs.document_markdown,
                             "jsonl": outputs.document_result_jsonl}[fmt](document)  # fmt: skip
                    with partial.open("w") as f:
                        f.writelines(parts)
                partial.replace(target)
                written.append(target)
        return written, missing


def _formats(value: str) -> list[str]:
    formats = [part.strip().lower() for part in value.split(",") if part.strip()]
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown or not formats:
        raise ApiError(f"--format takes {', '.join(FORMATS)} (comma-separated), not {value!r}")
    return list(dict.fromkeys(formats))
