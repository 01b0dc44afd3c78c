"""A job submission's fields, declared once.

``SubmissionFields`` is what a submission says besides its files, and everything else follows
from it: the JSON body of ``POST /v1/jobs`` (``JobSubmission``: URLs only, so at least one), its
multipart body and the job form (``submission_from_form``: the same fields sent as text, parsed
as the model's types), the form's inputs (ocrjobs/forms.py), both request bodies in OpenAPI
(fleetadmin/openapi.py) and the keywords ``job_submit`` takes (``job_submit_arguments``).

A new field is declared here, and taken by the service that uses it under the same name.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable
from typing import Literal

from django.http import QueryDict
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleetadmin.errors import Invalid
from ocrjobs.services.schedule import resolve_schedule
from ocrjobs.services.webhooks import check_callback_url

MAX_LABELS = 10
LABEL = re.compile(r"[\w.-]{1,40}")


class SubmissionFields(BaseModel):
    """A submission's fields. Strict as JSON; sent as text (multipart, the form), each value is
    parsed as its type. The services check what a type cannot say (languages, URLs, schedule)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    urls: list[str] = Field(
        default=[], max_length=1000, title="URLs", examples=["https://example.org/report.pdf"],
        description="http(s) URLs of PDFs or images, fetched by a worker (as text: one a line)",
    )  # fmt: skip
    pool: str | None = Field(
        default=None, description="pool key (default: the cheapest open pool that meets the forecast)"
    )
    languages: str | None = Field(default="eng", description="tesseract codes joined by +, e.g. eng+deu")
    text_mode: Literal["skip", "redo", "force"] = Field(
        default="redo", title="Pages that already have text",
        description="skip: a PDF page with a usable text layer keeps it, no OCR; redo: every page read, an "
        "old invisible text layer replaced by ours, visible text kept; force: every page read, the searchable "
        "PDF carries our text only (a page with visible text drawn as an image). A page whose text layer is "
        "mojibake is read in every mode, with a warning (OCRmyPDF's --skip-text, --redo-ocr, --force-ocr)",
    )  # fmt: skip
    skip_text_pages: bool = Field(
        default=False, title="Skip pages that already have text",
        description="true: text_mode skip (its older name, still taken)",
    )  # fmt: skip
    searchable_pdf: bool = Field(
        default=False, title="Build searchable PDFs",
        description="each document's searchable PDF is built as the job ends; without it, when first downloaded",
    )  # fmt: skip
    max_dollars: float | None = Field(
        default=None, title="Budget ($)", description="no pod is booted for its pages once the job has cost this"
    )
    deadline: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}, examples=["2026-12-01T14:00:00Z"],
        description="ISO 8601 with a time zone: the pool is sized to meet it",
    )  # fmt: skip
    priority: Literal["fastest", "balanced", "cheapest"] | None = Field(
        default="balanced", description="how the pool is sized when there is no deadline"
    )
    labels: list[str] = Field(
        default=[], max_length=MAX_LABELS, title="Labels", examples=["invoices, 2026-q4"],
        description="words to find the job by in the job list: letters, digits, '.', '_' or '-', up to 40 "
                    "characters each, 10 at most (as text: separated by commas or lines)",
    )  # fmt: skip
    dry_run: bool = Field(default=False, description="answer the forecast only; nothing is stored")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: object) -> object:
        """Labels as people type them: split at commas, trimmed, in lower case, each once."""
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return value  # (the type check says what is wrong)
        labels = []
        for label in (part.strip().lower() for item in value for part in item.split(",")):
            if not label:
                continue
            if not LABEL.fullmatch(label):
                raise ValueError(
                    f"a label is letters, digits, '.', '_' or '-', up to 40 characters, not {label[:41]!r}"
                )
            if label not in labels:
                labels.append(label)
        return labels

    callback_url: str | None = Field(
        default=None, json_schema_extra={"format": "uri"}, title="Callback URL",
        description="posted a signed event when the job ends",
    )  # fmt: skip


class JobSubmission(SubmissionFields):
    """A submission as JSON: its documents are URLs, so it has at least one."""

    urls: list[str] = Field(
        min_length=1, max_length=1000, title="URLs", examples=["https://example.org/report.pdf"],
        description="http(s) URLs of PDFs or images, fetched by a worker",
    )  # fmt: skip


class SubmissionInvalid(Invalid):
    """Fields that do not parse: ``errors`` has (field, message) for each, in field order;
    the API answers the first."""

    def __init__(self, errors: list[tuple[str, str]]):
        field, message = errors[0]
        super().__init__(f"{field}: {message}", field=field)
        self.errors = errors


def _is_list(annotation) -> bool:
    return typing.get_origin(annotation) is list


def _takes_text(annotation) -> bool:
    return annotation is str or str in typing.get_args(annotation)


def submission_from_form(
    data: QueryDict, *, model: type[SubmissionFields] = SubmissionFields, exclude: Iterable[str] = ()
) -> SubmissionFields:
    """The model's fields read from form data (a multipart body, the job form); other names are
    left to the caller. A list takes the field repeated and one value a line; any other field
    is sent once. A blank value leaves a field that is not text at its default (an unticked
    box, an empty number); a blank text is the services' to judge (``languages=`` is refused).
    Raises SubmissionInvalid."""
    values: dict = {}
    errors: list[tuple[str, str]] = []
    for name, field in model.model_fields.items():
        if name in exclude or name not in data:
            continue
        sent = data.getlist(name)
        if _is_list(field.annotation):
            values[name] = [line.strip() for value in sent for line in value.splitlines() if line.strip()]
        elif len(sent) > 1:
            errors.append((name, "the field was sent more than once"))
        elif sent[0] != "" or _takes_text(field.annotation):
            values[name] = sent[0]
    return submission_from_values(values, model=model, errors=errors)


def submission_from_values(
    values: dict, *, model: type[SubmissionFields] = SubmissionFields, errors: list[tuple[str, str]] | None = None
) -> SubmissionFields:
    """The model's fields from values of any type each parses from (text, as a form or the
    command line sends them); ``errors`` found before are answered with the model's, in field
    order. Raises SubmissionInvalid."""
    errors = list(errors or [])
    fields = None
    try:
        fields = model.model_validate(values, strict=False)
    except ValidationError as exc:
        errors += [(str(error["loc"][0]), error["msg"]) for error in exc.errors()]
    if errors:
        order = list(model.model_fields)
        raise SubmissionInvalid(sorted(errors, key=lambda error: order.index(error[0])))
    return fields


def job_submit_arguments(fields: SubmissionFields) -> dict:
    """The fields as ``job_submit``'s keywords: the budget, deadline and priority checked together
    as its ``schedule``, the callback URL checked, ``pool`` as ``pool_key``; any other field by
    its own name. ``dry_run`` is the caller's (the form's forecast is one)."""
    values = fields.model_dump(exclude={"dry_run"})
    if values.pop("skip_text_pages"):  # the older name of text_mode skip
        if "text_mode" in fields.model_fields_set and fields.text_mode != "skip":
            raise SubmissionInvalid([("skip_text_pages", f"true contradicts text_mode {fields.text_mode}")])
        values["text_mode"] = "skip"
    schedule = resolve_schedule(
        max_dollars=values.pop("max_dollars"), deadline=values.pop("deadline"), priority=values.pop("priority")
    )
    callback_url = check_callback_url(values.pop("callback_url"))
    pool_key = values.pop("pool")
    return {**values, "pool_key": pool_key, "schedule": schedule, "callback_url": callback_url}


class LineCorrectionBody(BaseModel):
    """``PATCH /v1/jobs/{id}/pages/{page_id}/lines/{line}``: a line's corrected text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(description="the line as it should read: one line, 1 to 2,000 characters")
