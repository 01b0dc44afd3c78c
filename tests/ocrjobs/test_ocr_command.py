"""manage.py ocr: bad input exits 2 with nothing made; a submitted job is followed to its text files.

The run with real workers, pods and tesseract is in tests/e2e; here a thread plays the
workers through the services, so the command's own part (follow, write, exit code) is
what is tested.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection

from ocrjobs.models import Job
from tests.factories import PAGES_TRUTH, corrupt_pdf_bytes, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, result_for, split

# A guard against a hang only; no test asserts how long anything takes.
HANG_GUARD = 120


def run_ocr(*args: str) -> tuple[int, str]:
    """The command's exit code and what it wrote to its stderr."""
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("ocr", *args, stderr=stderr)
    return exited.value.code, stderr.getvalue()


@pytest.fixture
def out(tmp_path):
    return tmp_path / "out"


# --- bad input --------------------------------------------------------------------------


def test_a_missing_file_exits_2_and_makes_nothing(local_pool, media_root, tmp_path, out):
    good = tmp_path / "good.pdf"
    good.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    code, stderr = run_ocr(str(good), str(tmp_path / "missing.pdf"), "--out", str(out))

    assert code == 2
    assert "missing.pdf: no such file" in stderr
    assert_nothing_made(media_root)
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("empty.pdf", b"", "empty.pdf: the file is empty"),
        ("broken.pdf", corrupt_pdf_bytes(), "broken.pdf: the PDF is corrupt"),
        ("notes.txt", b"words\n", "notes.txt: not a PDF, PNG, JPEG or TIFF file"),
    ],
)
def test_a_bad_file_exits_2_and_makes_nothing(local_pool, media_root, tmp_path, out, name, content, said):
    path = tmp_path / name
    path.write_bytes(content)

    code, stderr = run_ocr(str(path), "--out", str(out))

    assert code == 2
    assert said in stderr
    assert_nothing_made(media_root)


def test_a_refusal_leaves_no_out_directory_behind(local_pool, media_root, tmp_path):
    path = tmp_path / "broken.pdf"
    path.write_bytes(corrupt_pdf_bytes())
    (tmp_path / "kept").mkdir()

    code, stderr = run_ocr(str(path), "--out", str(tmp_path / "kept" / "made" / "out"))

    assert code == 2 and "broken.pdf: the PDF is corrupt" in stderr
    assert list((tmp_path / "kept").iterdir()) == []  # the two it made are gone, the one it found kept


def test_an_unknown_pool_exits_2_and_makes_nothing(local_pool, media_root, tmp_path, out):
    path = tmp_path / "a.png"
    path.write_bytes(image_bytes(["a"]))

    code, stderr = run_ocr(str(path), "--pool", "nowhere", "--out", str(out))

    assert code == 2
    assert "unknown pool 'nowhere'" in stderr
    assert_nothing_made(media_root)


def test_an_out_path_that_cannot_be_a_directory_exits_2_and_makes_nothing(local_pool, media_root, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(image_bytes(["a"]))
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a directory")

    code, stderr = run_ocr(str(path), "--out", str(blocker / "texts"))

    assert code == 2
    assert "cannot create the output directory" in stderr
    assert_nothing_made(media_root)


# --- a submitted job ---------------------------------------------------------------------


def test_it_creates_out_submits_and_exits_4_when_the_job_outlasts_the_timeout(local_pool, tmp_path, out):
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes())

    # No worker runs here, so the job waits for ever.
    code, stderr = run_ocr(str(path), "--out", str(out), "--timeout", "0.1")

    job = Job.objects.get()
    assert code == 4
    assert f"job {job.pk} submitted to pool local" in stderr
    assert f"follow it at /v1/jobs/{job.pk}" in stderr
    assert out.is_dir()
    assert list(out.iterdir()) == []
    assert job.owner is None
    assert [(d.name, d.page_count) for d in job.documents.all()] == [("report.pdf", 3)]


class Workers(threading.Thread):
    """Plays the workers: waits for the command's job, splits it, finishes its pages."""

    def __init__(self, texts=None, failures=None, results=None):
        super().__init__(daemon=True)
        self.texts, self.failures, self.results = texts, failures, results
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + HANG_GUARD
            while not Job.objects.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("the command submitted no job")
                time.sleep(0.05)
            job = Job.objects.get()
            split(job)
            complete_all(job, self.texts, self.failures, results=self.results)
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()


@pytest.mark.django_db(transaction=True)
def test_it_writes_one_text_file_per_document_and_exits_0_when_every_page_is_done(local_pool, tmp_path, out):
    (tmp_path / "in").mkdir()
    report, note, same_stem = tmp_path / "in" / "report.pdf", tmp_path / "in" / "note.png", tmp_path / "in" / "note.pdf"
    report.write_bytes(pdf_bytes(PAGES_TRUTH[:2]))
    note.write_bytes(image_bytes(["a note"]))
    same_stem.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    workers = Workers(texts={(0, 1): "first page", (0, 2): "second page", (1, 1): "a note", (2, 1): "other note"})
    workers.start()

    code, stderr = run_ocr(str(report), str(note), str(same_stem), "--out", str(out), "--timeout", str(HANG_GUARD))
    workers.join(HANG_GUARD)

    assert workers.error is None
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["note-2.txt", "note.txt", "report.txt"]
    assert (out / "report.txt").read_text() == "first page\n\fsecond page\n"
    assert (out / "note.txt").read_text() == "a note\n"
    assert (out / "note-2.txt").read_text() == "other note\n"
    assert "done: 4 pages done, 0 failed; wrote 3 files" in stderr


@pytest.mark.django_db(transaction=True)
def test_it_exits_1_when_a_page_failed_and_still_writes_the_rest(local_pool, tmp_path, out):
    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_bytes(PAGES_TRUTH[:2]))
    workers = Workers(texts={(0, 1): "first page"}, failures={(0, 2): "the pod refused the page"})
    workers.start()

    code, stderr = run_ocr(str(report), "--out", str(out), "--timeout", str(HANG_GUARD))
    workers.join(HANG_GUARD)

    assert workers.error is None
    assert code == 1, stderr
    assert (out / "report.txt").read_text() == "first page\n\f"
    assert "partial: 1 pages done, 1 failed" in stderr


@pytest.mark.django_db(transaction=True)
def test_it_exits_3_and_names_each_page_with_a_warning(local_pool, tmp_path, out):
    report = tmp_path / "report.pdf"
    report.write_bytes(pdf_bytes(PAGES_TRUTH[:2]))
    garbage = {**result_for("AN NNIT 6F6867# XATAL"), "confidence": 4.0}
    workers = Workers(results={(0, 1): result_for("first page"), (0, 2): garbage})
    workers.start()

    code, stderr = run_ocr(str(report), "--out", str(out), "--timeout", str(HANG_GUARD))
    workers.join(HANG_GUARD)

    assert workers.error is None
    assert code == 3, stderr
    assert "ocr: warning: report.pdf page 2: low confidence: read at 4, under 30" in stderr
    assert "done: 2 pages done, 1 with warnings, 0 failed" in stderr
    assert (out / "report.txt").exists()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_its_lines_are_plain_and_log_records_only_with_verbosity(local_pool, tmp_path, monkeypatch,
                                                                               caplog):  # fmt: skip
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setattr(sys, "stderr", terminal)
    caplog.set_level(logging.INFO)

    with pytest.raises(SystemExit):
        call_command("ocr", str(path), "--out", str(tmp_path / "out"), "--timeout", "0.1")  # on sys.stderr

    assert "submitted to pool local" in terminal.getvalue()
    assert "\x1b[" not in terminal.getvalue()  # Django's bold red for a command's stderr
    assert not [r for r in caplog.records if r.name.startswith("ocrjobs")]

    with pytest.raises(SystemExit):
        call_command("ocr", str(path), "--out", str(tmp_path / "out"), "--timeout", "0.1", "--verbosity", "2")

    assert any(r.name.startswith("ocrjobs") and "submitted" in r.getMessage() for r in caplog.records)
    assert logging.root.manager.disable == logging.NOTSET  # left as it was found
