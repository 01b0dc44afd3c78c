"""A submission's fields are declared once (ocrjobs/schemas.py) and drive the job form, the
multipart and JSON bodies of POST /v1/jobs, OpenAPI and job_submit's keywords: a field added
to the model reaches each of them without another edit."""

from __future__ import annotations

import html

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import QueryDict
from pydantic import Field

from fleetadmin.openapi import multipart_schema, openapi
from ocrjobs.forms import NOT_ON_THE_FORM, JobForm, submission_form_fields
from ocrjobs.models import Job
from ocrjobs.schemas import SubmissionFields, SubmissionInvalid, job_submit_arguments, submission_from_form
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.ocrjobs.helpers import assert_nothing_made
from tests.ocrjobs.test_job_form import assert_no_job_and_the_files_kept
from tests.ocrjobs.test_submit_api import assert_refused

pytestmark = pytest.mark.usefixtures("local_pool")


class WithDpi(SubmissionFields):
    """The submission with one field more, as a developer would add it."""

    dpi: int = Field(default=300, description="render resolution")


def test_every_field_of_the_model_is_on_the_form_and_in_both_bodies_in_openapi(db):
    body = openapi()["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    names = set(SubmissionFields.model_fields)

    assert len(names) >= 9  # the model is read (an empty one would pass vacuously)
    assert set(JobForm().fields) == names - set(NOT_ON_THE_FORM) | {"files"}
    assert set(body["application/json"]["schema"]["properties"]) == names
    assert set(body["multipart/form-data"]["schema"]["properties"]) == names | {"files"}


def test_multipart_fields_have_their_real_types_in_openapi(db):
    fields = openapi()["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    types = {name: field.get("type") for name, field in fields["properties"].items()}

    assert types == {"urls": "array", "pool": "string", "languages": "string", "text_mode": "string", "skip_text_pages": "boolean",
                     "searchable_pdf": "boolean",
                     "max_dollars": "number", "deadline": "string", "priority": "string", "dry_run": "boolean",
                     "callback_url": "string", "labels": "array", "files": "array"}  # fmt: skip
    assert fields["properties"]["priority"]["enum"] == ["fastest", "balanced", "cheapest"]
    assert fields["properties"]["deadline"]["format"] == "date-time"
    assert fields["properties"]["callback_url"]["format"] == "uri"
    assert fields["properties"]["files"]["items"]["contentMediaType"] == "application/octet-stream"


def test_a_field_added_to_the_model_reaches_the_form_openapi_the_parser_and_job_submit():
    form_field = submission_form_fields(WithDpi)["dpi"]
    assert form_field.widget.input_type == "number" and form_field.initial == 300
    assert multipart_schema(WithDpi)["properties"]["dpi"] == {
        "type": "integer", "default": 300, "description": "render resolution", "title": "Dpi",
    }  # fmt: skip
    fields = submission_from_form(QueryDict("dpi=400"), model=WithDpi)
    assert fields.dpi == 400
    assert job_submit_arguments(fields)["dpi"] == 400  # job_submit takes it by its name


def test_form_text_is_parsed_as_the_models_types():
    fields = submission_from_form(QueryDict("urls=https://a.org/1.pdf%0D%0A%0D%0Ahttps://a.org/2.pdf&urls=https://a.org/3.pdf"
                                            "&skip_text_pages=on&max_dollars=4.25&priority=&dry_run=&pool="))  # fmt: skip

    assert fields.urls == ["https://a.org/1.pdf", "https://a.org/2.pdf", "https://a.org/3.pdf"]
    assert (fields.skip_text_pages, fields.max_dollars, fields.priority, fields.dry_run) == (
        True,
        4.25,
        "balanced",
        False,
    )
    assert fields.pool == ""  # text: the service judges it (the default pool)
    assert submission_from_form(QueryDict("languages=")).languages == ""  # refused by the service, not made "eng"


def test_form_text_that_does_not_parse_is_refused_per_field():
    with pytest.raises(SubmissionInvalid) as refused:
        submission_from_form(QueryDict("max_dollars=lots&skip_text_pages=maybe&languages=eng&languages=deu"))

    assert [field for field, _ in refused.value.errors] == ["languages", "skip_text_pages", "max_dollars"]
    assert refused.value.message == "languages: the field was sent more than once"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"skip_text_pages": "maybe"}, ["skip_text_pages", "boolean"]),
        ({"text_mode": "sandwich"}, ["text_mode", "skip", "redo", "force"]),
        ({"text_mode": "force", "skip_text_pages": "true"}, ["skip_text_pages", "contradicts", "force"]),
        ({"dry_run": "2"}, ["dry_run"]),
        ({"max_dollars": "lots"}, ["max_dollars", "number"]),
        ({"priority": "urgent"}, ["priority", "fastest"]),
        ({"callback_url": "ftp://example.org/hook"}, ["callback_url", "http"]),
    ],
)
def test_a_multipart_field_that_does_not_parse_is_a_400(client, submit_token, media_root, fields, words):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post(
        "/v1/jobs", {"files": [upload], **fields}, headers={"Authorization": f"Bearer {submit_token}"}
    )

    assert_refused(response, 400, *words)
    assert_nothing_made(media_root)


def test_a_multipart_dry_run_answers_the_forecast_and_stores_nothing(client, submit_token, media_root):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post("/v1/jobs", {"files": [upload], "dry_run": "true", "max_dollars": "2"},
                           headers={"Authorization": f"Bearer {submit_token}"})  # fmt: skip

    assert response.status_code == 200, response.content
    assert response.json()["dry_run"] is True
    assert not Job.objects.exists()


def form_post(client, **fields):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))
    return client.post("/jobs/new", {"files": [upload], "pool": "local", "languages": "eng", **fields})


def test_the_form_offers_a_callback_url_and_stores_it(bob):
    assert 'name="callback_url"' in bob.get("/jobs/new").content.decode()

    response = form_post(bob, callback_url="https://example.org/hook")

    assert response.status_code == 302, html.unescape(response.content.decode())[-2000:]
    assert Job.objects.get().callback_url == "https://example.org/hook"


def test_the_form_refuses_a_callback_url_the_api_refuses_beside_its_input(bob, media_root):
    response = form_post(bob, callback_url="ftp://example.org/hook")

    assert response.status_code == 400
    assert response.context["form"].errors["callback_url"] == [
        "callback_url: ftp://example.org/hook: only http and https URLs can be fetched"
    ]
    assert_no_job_and_the_files_kept(media_root)  # (the form keeps the files chosen)


def test_the_form_shows_a_field_that_does_not_parse_beside_its_input(bob, media_root):
    response = form_post(bob, max_dollars="lots")

    assert response.status_code == 400
    assert list(response.context["form"].errors) == ["max_dollars"]
    assert "Input should be a valid number" in html.unescape(response.content.decode())
    assert_no_job_and_the_files_kept(media_root)  # (the form keeps the files chosen)


@pytest.mark.parametrize(
    ("fields", "mode"),
    [
        ({}, "redo"),
        ({"text_mode": "force"}, "force"),
        ({"text_mode": "skip"}, "skip"),
        ({"skip_text_pages": "true"}, "skip"),  # its older name
        ({"skip_text_pages": "true", "text_mode": "skip"}, "skip"),
        ({"skip_text_pages": "false", "text_mode": "force"}, "force"),
    ],
)
def test_text_mode_and_its_older_name_reach_the_job(client, submit_token, fields, mode):
    upload = SimpleUploadedFile("a.pdf", pdf_bytes(PAGES_TRUTH[:1]))

    response = client.post(
        "/v1/jobs", {"files": [upload], **fields}, headers={"Authorization": f"Bearer {submit_token}"}
    )

    assert response.status_code == 201, response.content
    assert (response.json()["text_mode"], response.json()["skip_text_pages"]) == (mode, mode == "skip")
    assert Job.objects.get().text_mode == mode


def test_text_mode_is_a_choice_in_the_form_openapi_and_the_command_line(bob):
    from ocrjobs.management.commands.ocr import Command

    page = bob.get("/jobs/new").content.decode()
    assert 'name="text_mode"' in page and 'value="force"' in page and 'name="skip_text_pages"' not in page
    body = openapi()["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["properties"]["text_mode"]["enum"] == ["skip", "redo", "force"]
    parser = Command().create_parser("manage.py", "ocr")
    (action,) = [a for a in parser._actions if a.dest == "text_mode"]
    assert action.choices == ["skip", "redo", "force"]
