"""manage.py ocr: it sees its job's end at the next status read (polls counted, never timed), and
its options are the submission schema's fields."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.management import load_command_class

from ocrjobs.management.commands import ocr
from ocrjobs.models import Job
from ocrjobs.schemas import SubmissionFields
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made, complete_all, split
from tests.ocrjobs.test_ocr_command import run_ocr


class Clock:
    """The command's clock: each sleep moves it on by what was asked, and the sleep numbered
    ``finish_at`` plays the workers (split, every page done): the job ends during that sleep."""

    def __init__(self, finish_at: int):
        self.now, self.sleeps, self.finish_at = 1000.0, 0, finish_at
        self.sleeps_after_the_end = 0
        self.ended = self.in_workers = False

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        if self.ended:
            self.sleeps_after_the_end += 1
        if self.sleeps == self.finish_at:
            self.in_workers = True
            job = Job.objects.get()
            split(job)
            complete_all(job)
            self.in_workers = False
            assert Job.objects.get().is_finished
            self.ended = True


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(finish_at=7)
    monkeypatch.setattr(ocr, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep))
    return clock


def test_it_exits_at_the_first_status_read_after_its_job_ended(local_pool, tmp_path, clock, capsys):
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:2]))

    code, stderr = run_ocr(str(path), "--out", str(tmp_path / "out"))

    assert code == 0, stderr
    assert clock.sleeps == 7 and clock.sleeps_after_the_end == 0  # no poll slept through the end
    assert clock.now - 1000.0 == pytest.approx(7 * ocr.END_POLL_SECONDS)
    assert ocr.END_POLL_SECONDS <= 0.1  # the end is seen within this of the job's end
    assert "[" + "#" * 30 + "] 2/2 pages" in capsys.readouterr().err  # the bar drawn once more, at the end
    assert (tmp_path / "out" / "report.txt").read_text() == "document 0 page 1\n\fdocument 0 page 2\n"


def test_it_counts_the_pages_for_its_bar_less_often_than_it_reads_the_status(local_pool, tmp_path, clock, monkeypatch):
    counted = []
    page_counts = Job.page_counts
    monkeypatch.setattr(Job, "page_counts", lambda job: counted.append(clock.in_workers) or page_counts(job))
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    code, _ = run_ocr(str(path), "--out", str(tmp_path / "out"))

    assert code == 0
    # 8 status reads over 0.7 s; the command's counts: the first draw, one 0.5 s later, the end's
    # and the summary line's (the others are the workers' job refreshes, played here).
    assert counted.count(False) == 4


def test_every_submission_field_but_dry_run_is_an_option():
    parser = load_command_class("ocrjobs", "ocr").create_parser("manage.py", "ocr")
    options = {action.dest: action for action in parser._actions}
    for name in SubmissionFields.model_fields:
        assert (name in options) == (name != "dry_run"), name
    assert options["priority"].choices == ["fastest", "balanced", "cheapest"]
    assert options["skip_text_pages"].nargs == 0  # a flag


@pytest.mark.django_db(transaction=True)
def test_the_schemas_fields_reach_the_job(local_pool, tmp_path):
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    code, _ = run_ocr(
        str(path), "--out", str(tmp_path / "out"), "--timeout", "0.05", "--skip-text-pages",
        "--callback-url", "https://hooks.example.org/ocr", "--priority", "cheapest", "--languages", "eng",
    )  # fmt: skip

    assert code == 4, _  # no worker here: it gave up waiting, the job was submitted
    job = Job.objects.get()
    assert job.text_mode == Job.TextMode.SKIP  # (--skip-text-pages: its older name)
    assert job.callback_url == "https://hooks.example.org/ocr"
    assert (job.priority, job.languages) == ("cheapest", "eng")


@pytest.mark.parametrize(
    "option, said",
    [
        (["--max-dollars", "ten"], "max_dollars: Input should be a valid number"),
        (["--callback-url", "http://127.0.0.1/hook"], "callback_url:"),
        (["--skip-text-pages", "--priority", "fastest", "--deadline", "2026-12-01T14:00:00Z"], "deadline"),
    ],
)
def test_a_field_the_schema_refuses_exits_2_and_makes_nothing(local_pool, media_root, tmp_path, option, said):
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf_bytes(PAGES_TRUTH[:1]))

    code, stderr = run_ocr(str(path), "--out", str(tmp_path / "out"), *option)

    assert code == 2
    assert said in stderr
    assert not Job.objects.exists()
    assert_nothing_made(media_root)


def test_no_files_and_no_urls_exits_2(local_pool, media_root, tmp_path):
    code, stderr = run_ocr("--out", str(tmp_path / "out"))

    assert code == 2 and "no files" in stderr
    assert not Job.objects.exists()


class Exited(Exception):
    pass


@pytest.mark.parametrize("args, code", [(["missing.pdf"], 2), (["--format", "doc", "a.pdf"], 2), (["--help"], 0)])
def test_from_the_command_line_it_leaves_with_its_code_and_the_database_closed(
    local_pool, monkeypatch, capsys, args, code
):
    left, closed = [], []
    monkeypatch.setattr(ocr.connections, "close_all", lambda: closed.append(True))

    def exit_now(status: int) -> None:
        left.append(status)
        raise Exited

    monkeypatch.setattr(ocr.os, "_exit", exit_now)

    with pytest.raises(Exited):
        load_command_class("ocrjobs", "ocr").run_from_argv(["manage.py", "ocr", *args])

    assert left == [code]  # once, with the command's exit code: no teardown after it
    assert closed
