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

from fleetadmin.errors import DomainError
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


# The form's words for people; the API's (ocrjobs/schemas.py, docs/api.md) stay as they are.
FORM_WORDS = {
    "files": ("Files", "PDF, PNG, JPEG or TIFF; choose several at once"),
    "urls": ("Documents by address", "web addresses (http or https) of PDFs or images, one a line; fetched for you"),
    "pool": (
        "Pool",
        "Where the pages are read. “Cheapest” sends the job to the open pool whose forecast costs "
        "least for your priority, or least among those that meet your deadline; the forecast below "
        "marks the pool and sizing the job takes.",
    ),
    "languages": ("Languages", "the documents’ languages: eng, or eng+deu for English and German"),
    "text_mode": (
        "Pages that already have text",
        "Redo: an old invisible text layer is replaced by ours; Skip: a PDF page with usable text keeps it and "
        "is not read; Force: the searchable PDF carries our text only",
    ),
    "searchable_pdf": ("Build searchable PDFs when the job ends", "otherwise each is built when first downloaded"),
    "max_dollars": ("Budget ($)", "optional: no pod is started for the job once it has cost this much"),
    "deadline": ("Deadline", "optional: enough pods are started to finish by then"),
    "priority": ("Priority", "how many pods to start when there is no deadline"),
    "callback_url": ("Notify address", "optional: a web address we send a signed message to when the job ends"),
    "labels": ("Labels", "optional: words to find the job by in the job list, separated by commas"),
}
CHEAPEST = "Cheapest that meets the forecast"
TEXT_MODES = [("redo", "Redo: read every page, replace old text"), ("skip", "Skip: keep a page's own text"),
              ("force", "Force: read every page, our text only")]  # fmt: skip
PRIORITIES = [("fastest", "Fastest: more pods"), ("balanced", "Balanced"), ("cheapest", "Cheapest: fewest pods")]
DEADLINE_FORMAT = "%Y-%m-%dT%H:%M"  # what <input type="datetime-local"> sends and shows


def deadline_aware(value: str) -> str:
    """A deadline as the date-time picker sends it (no time zone) read in the site's time zone,
    as ISO 8601 with its offset (as the API takes it); anything else as it came, for the
    submission's own checks to judge."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = timezone.make_aware(moment)
    return moment.isoformat()


class JobForm(forms.Form):
    files = MultipleFileField(required=False)

    def __init__(self, *args, user=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields.update(submission_form_fields(SubmissionFields, exclude=NOT_ON_THE_FORM))
        # The pools open to the user, to choose from (another pool: "not one of the choices"); by
        # default none named: the job takes the cheapest that meets its forecast (job_submit).
        self.fields["pool"] = forms.ModelChoiceField(
            queryset=Pool.objects.open_to(user).order_by("key"), to_field_name="key", required=False,
            empty_label=CHEAPEST,
        )  # fmt: skip
        self.fields["priority"].widget = forms.Select(choices=PRIORITIES)
        self.fields["text_mode"].widget = forms.Select(choices=TEXT_MODES)
        now = timezone.localtime().replace(second=0, microsecond=0)
        self.fields["deadline"].widget = forms.DateTimeInput(
            attrs={"type": "datetime-local", "min": now.strftime(DEADLINE_FORMAT)}, format=DEADLINE_FORMAT
        )
        self.fields[
            "deadline"
        ].help_text = f"{FORM_WORDS['deadline'][1]} (time in {timezone.get_current_timezone_name()})"
        self.fields["urls"].widget.attrs.pop("placeholder", None)
        self.fields["labels"].widget = forms.TextInput(attrs={"placeholder": "e.g. invoices, 2026-q4"})
        for name, (label, help_text) in FORM_WORDS.items():
            self.fields[name].label = label
            if name != "deadline":
                self.fields[name].help_text = help_text

    def clean(self):
        cleaned = super().clean()
        cleaned["files"] = [f for f in cleaned.get("files") or [] if f]
        data = self.data.copy()
        if data.get("deadline"):
            data["deadline"] = deadline_aware(data["deadline"])
        # Neither files nor URLs: the submission service says so, in the same words as the API.
        try:
            cleaned["submission"] = submission = submission_from_form(data, exclude=NOT_ON_THE_FORM)
        except SubmissionInvalid as exc:
            for name, message in exc.errors:
                if name not in self.errors:
                    self.add_error(name, message)
            return cleaned
        try:  # (checked again on submission; here it is shown beside its input)
            check_callback_url(submission.callback_url)
        except DomainError as exc:
            self.add_error("callback_url", exc.message)
        return cleaned


class JobListFilters(forms.Form):
    """The job list's search and filters (a GET form: the address keeps them, pages included)."""

    q = forms.CharField(required=False, max_length=255, label="Document name",
                        widget=forms.TextInput(attrs={"type": "search", "placeholder": "part of a name"}))  # fmt: skip
    status = forms.ChoiceField(required=False, choices=[("", "any")])
    pool = forms.ChoiceField(required=False, choices=[("", "any")])
    label = forms.CharField(required=False, max_length=40, label="Label")
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
        if data["label"]:
            jobs = jobs.filter(labels__contains=f",{data['label'].strip().lower()},")
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
