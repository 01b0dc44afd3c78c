"""Submit files to the running fleetadmin, follow the job, write one file per document and format
(``--format txt,md,pdf,jsonl,hocr,alto``; txt by default). ``pdf`` asks the job for searchable PDFs
(``--searchable-pdf``), built by the outputs workers once the job ends: the command waits for
them too.

Exit codes: 0 every page has text; 1 some pages or documents failed (the text
of the others is written); 2 bad input (nothing was submitted, nothing left in
--out); 3 every page has text but some carry a warning (unusable as it stands:
each is named on stderr); 4 gave up waiting (the job goes on; its id is printed).

Its lines on stderr are plain (the progress, the job's end, what went wrong); log
records of the project's modules show only with ``-v 2`` or more.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import typing
from pathlib import Path
from typing import Literal

from django.core.management.base import BaseCommand
from django.db import connections

from fleetadmin.errors import DomainError, Invalid
from ocrjobs import selectors
from ocrjobs.models import Document, Job, Page, SearchablePdf
from ocrjobs.results import StoredResult
from ocrjobs.schemas import SubmissionFields, job_submit_arguments, submission_from_values
from ocrjobs.services import layout_xml, outputs
from ocrjobs.services.submission import Upload, job_submit

EXIT_OK, EXIT_PARTIAL, EXIT_BAD_INPUT, EXIT_WARNINGS, EXIT_TIMEOUT = 0, 1, 2, 3, 4
# Pages with warnings named on stderr at the most; the rest are counted.
WARNINGS_SHOWN = 20
FORMATS = ("txt", "md", "pdf", "jsonl", "hocr", "alto")
SUFFIXES = {"alto": "alto.xml"}  # a format's file name ends with this (else its own name)
# A job's end is seen within END_POLL_SECONDS (it was 0.5 s: ~0.25 s of every run's wait on
# average); the bar is redrawn every PROGRESS_SECONDS.
END_POLL_SECONDS = 0.1
PROGRESS_SECONDS = 0.5
# The submission's fields the command takes, as --options (ocrjobs/schemas.py); a dry run is the
# form's and the API's (the command submits).
CLI_FIELDS = [name for name in SubmissionFields.model_fields if name != "dry_run"]


class Command(BaseCommand):
    help = "OCR PDF and image files with the running fleetadmin and write one .txt per document."

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="*", metavar="FILE")
        _submission_arguments(parser)
        parser.add_argument("--out", default=".", help="directory for the .txt files (default: here)")
        parser.add_argument("--timeout", type=float, default=0, help="seconds to wait; 0 waits for ever")
        parser.add_argument("--format", default="txt", help=f"what to write per document, comma-separated: "
                            f"{', '.join(FORMATS)} (default txt)")  # fmt: skip

    def execute(self, *args, **options):
        # Django writes a command's stderr in bold red on a terminal (its style for errors): this
        # command's ordinary lines there are progress and results, written plain.
        self.stderr.style_func = None
        # The project's log records (INFO: a job submitted, a page stored) are for -v 2 and up;
        # the command says what a user needs in its own lines.
        quiet = options.get("verbosity", 1) < 2
        before = logging.root.manager.disable
        if quiet:
            logging.disable(logging.WARNING)
        try:
            return super().execute(*args, **options)
        finally:
            if quiet:
                logging.disable(before)

    def handle(self, *args, files, out, timeout, **options):
        out_dir = Path(out)
        uploads = []
        started = time.monotonic()
        made: list[Path] = []
        try:
            formats = _formats(options["format"])
            values = {name: options[name] for name in CLI_FIELDS if options[name] is not None}
            if "pdf" in formats:
                values["searchable_pdf"] = True  # asked for as the job ends, not on the first download
            fields = submission_from_values(values)
            for name in files:
                path = Path(name)
                if not path.is_file():
                    raise Invalid(f"{name}: no such file")
                uploads.append(Upload(name=path.name, file=path.open("rb")))
            made = _missing_directories(out_dir)
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                # Found before submitting, so that no job runs whose text cannot be written.
                raise Invalid(f"{out}: cannot create the output directory ({exc.strerror})") from None
            job = job_submit(owner=None, uploads=uploads, **job_submit_arguments(fields))
        except DomainError as exc:
            _remove_empty(made)  # a refusal leaves nothing behind, not even an empty --out
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
        self.write_warnings(job, counts["warnings"])
        with_warnings = f", {counts['warnings']} with warnings" if counts["warnings"] else ""
        self.stderr.write(
            f"job {job.pk} {job.status}: {counts['done']} pages done{with_warnings}, {counts['failed']} failed; "
            f"wrote {len(written)} files to {out_dir}"
        )
        if job.status != Job.Status.DONE or missing:
            sys.exit(EXIT_PARTIAL)
        sys.exit(EXIT_WARNINGS if counts["warnings"] else EXIT_OK)

    def write_warnings(self, job: Job, count: int) -> None:
        """Each page with warnings and its warnings, one line each (the first WARNINGS_SHOWN pages)."""
        if not count:
            return
        pages = job.pages.filter(status=Page.Status.DONE, warnings__gt=0).select_related("document")
        for page in pages.order_by("document__position", "number")[:WARNINGS_SHOWN]:
            for warning in (StoredResult.from_row(page) or StoredResult()).warnings:
                self.stderr.write(f"ocr: warning: {page.document.name} page {page.number}: {warning}")
        if count > WARNINGS_SHOWN:
            self.stderr.write(f"ocr: warning: {count - WARNINGS_SHOWN} more pages with warnings (result.jsonl)")

    def run_from_argv(self, argv):
        """Run from the command line (manage.py): its exit skips the interpreter's teardown."""
        try:
            super().run_from_argv(argv)
        except SystemExit as exc:
            _exit_now(exc.code)
        _exit_now(0)

    def follow(self, job: Job, timeout: float) -> bool:
        """Draw a progress bar until the job finishes; False on time-out. The job's status is read
        every END_POLL_SECONDS (one indexed row: its end is seen within that), its pages counted
        for the bar every PROGRESS_SECONDS (an aggregate over them)."""
        tty = sys.stderr.isatty()
        started = time.monotonic()
        expected = sum(d.page_count for d in job.documents.all())
        status = Job.objects.filter(pk=job.pk).values_list("status", flat=True)
        last_line, drawn_at = "", None
        while True:
            job.status = status.get()
            now = time.monotonic()
            elapsed = now - started
            if job.is_finished or drawn_at is None or now - drawn_at >= PROGRESS_SECONDS:
                drawn_at = now
                counts = job.page_counts()
                ended = counts["done"] + counts["failed"] + counts["cancelled"]
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
            time.sleep(END_POLL_SECONDS)

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
            time.sleep(END_POLL_SECONDS)
        return True

    def write_outputs(self, job: Job, out_dir: Path, formats: list[str]) -> tuple[list[Path], list[str]]:
        """Each document's files in ``formats`` (written whole, then renamed into place): the files
        written, and what could not be (a searchable PDF that failed or was never asked for)."""
        written, missing = [], []
        documents = list(job.documents.select_related("searchable_pdf").order_by("position"))
        stems = outputs.output_stems(documents)
        for document in documents:
            for fmt in formats:
                target = out_dir / f"{stems[document.pk]}.{SUFFIXES.get(fmt, fmt)}"
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
                             "jsonl": outputs.document_result_jsonl, "hocr": layout_xml.document_hocr,
                             "alto": layout_xml.document_alto}[fmt](document)  # fmt: skip
                    with partial.open("w") as f:
                        f.writelines(parts)
                partial.replace(target)
                written.append(target)
        return written, missing


def _missing_directories(path: Path) -> list[Path]:
    """The directories ``mkdir(parents=True)`` would make for ``path``, deepest first."""
    missing = []
    path = path.absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:  # deepest first
        try:
            directory.rmdir()
        except OSError:
            return  # not made after all, or something was put in it: left as it is


def _formats(value: str) -> list[str]:
    formats = [part.strip().lower() for part in value.split(",") if part.strip()]
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown or not formats:
        raise Invalid(f"--format takes {', '.join(FORMATS)} (comma-separated), not {value!r}")
    return list(dict.fromkeys(formats))


def _submission_arguments(parser) -> None:
    """An --option for each of the submission's fields (``SubmissionFields``): its help from the
    field's description, its choices from a Literal, a flag for a bool, repeated for a list. Each
    is left None when not given, so the schema's default applies."""
    for name in CLI_FIELDS:
        field = SubmissionFields.model_fields[name]
        flag = "--" + name.replace("_", "-")
        help_ = field.description or ""
        annotation = field.annotation
        choices = [arg for option in (annotation, *typing.get_args(annotation)) if typing.get_origin(option) is Literal
                   for arg in typing.get_args(option)]  # fmt: skip
        if annotation is bool:
            parser.add_argument(flag, dest=name, action="store_true", default=None, help=help_)
        elif typing.get_origin(annotation) is list:
            parser.add_argument(flag, dest=name, action="append", metavar=name.upper().rstrip("S"),
                                help=f"{help_} (repeat for more)")  # fmt: skip
        else:
            parser.add_argument(flag, dest=name, choices=choices or None, help=help_)


def _exit_now(code) -> None:
    """Leave with ``code`` once every file is written, the logs flushed and the database closed,
    without the interpreter's teardown: a process that has loaded Django and the project takes
    0.3 s to end by itself on an idle 2-core machine and 0.8-1.9 s under load (sys.exit, 90,000
    objects freed and every module torn down), 0.05-0.12 s this way, after the job's end, on every
    run. Only from the command line: call_command (tests) keeps its SystemExit."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    logging.shutdown()
    connections.close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
