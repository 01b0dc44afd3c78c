"""manage.py ocr: bad input exits 2 with nothing made; a submitted job is followed to its text files.

The run with real workers, pods and tesseract is in tests/e2e; here a thread plays the
workers through the services, so the command's own part (follow, write, exit code) is
what is tested.
"""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import call_command
from django.db import connection

from ocrjobs.models import Job
from tests.factories import PAGES_TRUTH, corrupt_pdf_bytes, image_bytes, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, split

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

    def __init__(self, texts=None, failures=None):
        super().__init__(daemon=True)
        self.texts, self.failures = texts, failures
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
            complete_all(job, self.texts, self.failures)
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
