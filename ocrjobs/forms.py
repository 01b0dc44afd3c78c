"""The job form: its inputs are made from the submission's fields (ocrjobs/schemas.py) and its
values are parsed by them, as a multipart submission's are."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from datetime import datetime, time, timedelta

from django import forms
from django.db.models import Exists, OuterRef
from django.utils import timezone
from pydantic.fields import FieldInfo

from fleetadmin.api import ApiError
from ocrjobs.models import Document, Job
from ocrjobs.schemas import SubmissionFields, SubmissionInvalid, submission_from_form
from ocrjobs.services.webhooks import check_callback_url
from pods.models import Pool

# Not an input of the form: its forecast, shown as files are chosen, is the dry run.
NOT_ON_THE_FORM = ("dry_run", "skip_text_pages")  # (skip_text_pages: text_mode's older name)


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput(attrs={"accept": ".pdf,.png,.jpg,.jpeg,.tif,.tiff"}))
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        single = super().clean
        if isinstance(data, (list, tuple)):
            return [single(item, initial) for item in data]
        return [single(data, initial)]


def _widget(field: FieldInfo) -> forms.Widget:
    annotation = field.annotation
    options = [a for a in (annotation, *typing.get_args(annotation)) if typing.get_origin(a) is typing.Literal]
    placeholder = {"placeholder": field.examples[0]} if field.examples else {}
    if typing.get_origin(annotation) is list:
        return forms.Textarea(attrs={"rows": 3, **placeholder})
    if annotation is bool:
        return forms.CheckboxInput()
    if options:
        return forms.Select(choices=[(value, value) for value in typing.get_args(options[0])])
    if {int, float} & {annotation, *typing.get_args(annotation)}:
        return forms.NumberInput(attrs={"step": "any"})
    if (field.json_schema_extra or {}).get("format") == "uri":
        return forms.URLInput(attrs=placeholder)
    return forms.TextInput(attrs=placeholder)


def submission_form_fields(model: type[SubmissionFields], *, exclude: Iterable[str] = ()) -> dict[str, forms.Field]:
    """An input for each of the model's fields, labelled and explained by it. The inputs take
    the text as it is sent: the model parses it (``JobForm.clean``)."""
    return {
        name: forms.Field(
            required=False,
            widget=_widget(field),
            label=field.title or name.replace("_", " ").capitalize(),
            help_text=field.description or "",
            initial=field.default if field.default not in (None, False, []) else None,
        )
        for name, field in model.model_fields.items()
        if name not in exclude
    }


class JobForm(forms.Form):
    files = MultipleFileField(required=False, help_text="PDF, PNG, JPEG or TIFF; several at once")

    def __init__(self, *args, user=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields.update(submission_form_fields(SubmissionFields, exclude=NOT_ON_THE_FORM))
        # The pools open to the user, to choose from (another pool: "not one of the choices").
        pool = self.fields["pool"]
        self.fields["pool"] = forms.ModelChoiceField(
            queryset=Pool.objects.open_to(user), to_field_name="key", empty_label=None,
            label=pool.label, help_text=pool.help_text,
        )  # fmt: skip

    def clean(self):
        cleaned = super().clean()
        cleaned["files"] = [f for f in cleaned.get("files") or [] if f]
        # Neither files nor URLs: the submission service says so, in the same words as the API.
        try:
            cleaned["submission"] = submission = submission_from_form(self.data, exclude=NOT_ON_THE_FORM)
        except SubmissionInvalid as exc:
            for name, message in exc.errors:
                if name not in self.errors:
                    self.add_error(name, message)
            return cleaned
        try:  # (checked again on submission; here it is shown beside its input)
            check_callback_url(submission.callback_url)
        except ApiError as exc:
            self.add_error("callback_url", exc.message)
        return cleaned


class JobListFilters(forms.Form):
    """The job list's search and filters (a GET form: the address keeps them, pages included)."""

    q = forms.CharField(required=False, max_length=255, label="Document name",
                        widget=forms.TextInput(attrs={"type": "search", "placeholder": "part of a name"}))  # fmt: skip
    status = forms.ChoiceField(required=False, choices=[("", "any")])
    pool = forms.ChoiceField(required=False, choices=[("", "any")])
    owner = forms.CharField(required=False, max_length=150, label="Owner", help_text="a username")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, staff: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["status"].choices = [("", "any"), *Job.Status.choices]
        self.fields["pool"].choices = [("", "any"), *((key, key) for key in Pool.objects.order_by("key").values_list("key", flat=True))]  # fmt: skip
        if not staff:
            del self.fields["owner"]  # a user sees their own jobs only

    def clean(self) -> dict:
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("“From” is after “To”.")
        return data

    def filter(self, jobs):
        """``jobs`` narrowed by the cleaned filters (the form must be valid)."""
        data = self.cleaned_data
        if data["q"]:
            jobs = jobs.filter(Exists(Document.objects.filter(job=OuterRef("pk"), name__icontains=data["q"])))
        if data["status"]:
            jobs = jobs.filter(status=data["status"])
        if data["pool"]:
            jobs = jobs.filter(pool__key=data["pool"])
        if data.get("owner"):
            jobs = jobs.filter(owner__username=data["owner"])
        zone = timezone.get_current_timezone()
        if data["since"]:
            jobs = jobs.filter(created_at__gte=datetime.combine(data["since"], time.min, tzinfo=zone))
        if data["until"]:
            jobs = jobs.filter(
                created_at__lt=datetime.combine(data["until"] + timedelta(days=1), time.min, tzinfo=zone)
            )
        return jobs
