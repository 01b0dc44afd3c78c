from __future__ import annotations

from django import forms

from pods.models import Pool


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


class JobForm(forms.Form):
    files = MultipleFileField(required=False, help_text="PDF, PNG, JPEG or TIFF; several at once")
    urls = forms.CharField(
        required=False,
        label="URLs",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "https://example.org/report.pdf"}),
        help_text="or documents to fetch, one http(s) URL per line (a worker fetches them)",
    )
    pool = forms.ModelChoiceField(queryset=Pool.objects.all(), to_field_name="key", empty_label=None)
    languages = forms.CharField(initial="eng", max_length=100, help_text="tesseract codes joined by +, e.g. eng+deu")
    max_dollars = forms.DecimalField(
        required=False, min_value=0.01, decimal_places=2, label="Budget ($)",
        help_text="optional: no pod is booted for its pages once the job has cost this",
    )  # fmt: skip
    deadline = forms.DateTimeField(
        required=False,
        help_text="optional, ISO 8601 with a time zone (2026-12-01T14:00:00Z): the pool is sized to meet it",
    )
    priority = forms.ChoiceField(
        choices=[("balanced", "balanced (cost-aware)"), ("fastest", "fastest"), ("cheapest", "cheapest")],
        initial="balanced", required=False, help_text="used when there is no deadline",
    )  # fmt: skip
    skip_text_pages = forms.BooleanField(
        required=False, label="Skip pages that already have text", help_text="PDF pages with a text layer keep it"
    )

    def __init__(self, *args, user=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pool"].queryset = Pool.objects.open_to(user)  # (another pool: "not one of the choices")

    def clean(self):
        cleaned = super().clean()
        files = [f for f in cleaned.get("files") or [] if f]
        cleaned["files"] = files
        # Neither files nor URLs: the submission service says so, in the same words as the API.
        cleaned["url_list"] = [line.strip() for line in (cleaned.get("urls") or "").splitlines() if line.strip()]
        return cleaned
