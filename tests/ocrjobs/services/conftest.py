"""Fixtures for the service tests: a job of one split page, and that page."""

from __future__ import annotations

import pytest

from ocrjobs.models import Job, Page
from tests.factories import image_bytes
from tests.ocrjobs.helpers import split, submit


@pytest.fixture
def one_page_job(ordinary_user) -> Job:
    job = submit(ordinary_user, {"note.png": image_bytes(["a note"])})
    split(job)
    return job


@pytest.fixture
def page(one_page_job) -> Page:
    return one_page_job.pages.get()
