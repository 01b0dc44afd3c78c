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
    files = MultipleFileField(help_text="PDF, PNG, JPEG or TIFF; several at once")
    pool = forms.ModelChoiceField(queryset=Pool.objects.all(), to_field_name="key", empty_label=None)
    languages = forms.CharField(initial="eng", max_length=100, help_text="tesseract codes joined by +, e.g. eng+deu")
