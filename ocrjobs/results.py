"""A page's stored result, typed once: what the outputs, the viewer, the searchable PDF, the
selectors and the CLI read of ``Page.result``, instead of each reading a dict's keys.

``Page.result`` holds a pod's answer as it sent it (podserver.answers.PageAnswer, dumped with
only the fields it set), a text layer's reading, and what the control plane added (warnings, the
cascade's stages, corrections). Rows stored before a field existed still read: a missing key, or
one of the wrong type, takes its default. Numbers are kept as stored (an int stays an int, so
result.jsonl writes what it always wrote). Lines stay the dicts they were stored as (text, bbox,
confidence, baseline, angle, engine_text): each reader takes what it draws.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

DONE = "done"  # Page.Status.DONE (ocrjobs.models imports this module, not the other way round)


class _Row(Protocol):
    """A ``Page``, or what a reader took of its row."""

    status: str
    result: str


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class StoredResult:
    text: str = ""
    lines: list[dict[str, Any]] = field(default_factory=list)
    confidence: int | float | None = None  # 0-100
    width: int | float | None = None  # the pixels the pod read, which the boxes are in
    height: int | float | None = None
    dpi: int | float | None = None  # a PDF page: the DPI it was rendered at
    engine: str | None = None
    markdown: bool = False  # the text is Markdown (the pod's engine says so), shown as it is
    rotation: int | float | None = None  # how far the text was turned clockwise
    skew: int | float | None = None
    warnings: list[str] = field(default_factory=list)
    source: str | None = None  # "text layer": the page kept its own text, no pod read it
    text_layer: str | None = None  # "unusable": the page's own text layer is mojibake
    escalated: bool = False
    cascade: list[dict[str, Any]] | None = None  # a cascade's stages: pool, engine, confidence
    engine_text: str | None = None  # the engine's text of a page a person corrected
    corrected_lines: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> StoredResult:
        """A result as stored (JSON already parsed); anything but an object reads as empty."""
        if not isinstance(data, dict):
            return cls()
        text = data.get("text")
        lines = data.get("lines")
        cascade = data.get("cascade")
        corrected = _number(data.get("corrected_lines"))
        return cls(
            text=str(text) if text is not None else "",
            lines=[line for line in lines if isinstance(line, dict)] if isinstance(lines, list) else [],
            confidence=_number(data.get("confidence")),
            width=_number(data.get("width")),
            height=_number(data.get("height")),
            dpi=_number(data.get("dpi")),
            engine=_string(data.get("engine")),
            markdown=data.get("markdown") is True,
            rotation=_number(data.get("rotation")),
            skew=_number(data.get("skew")),
            warnings=[w for w in data.get("warnings") or [] if isinstance(w, str)],
            source=_string(data.get("source")),
            text_layer=_string(data.get("text_layer")),
            escalated=bool(data.get("escalated")),
            cascade=[stage for stage in cascade if isinstance(stage, dict)] if isinstance(cascade, list) else None,
            engine_text=_string(data.get("engine_text")),
            corrected_lines=int(corrected) if corrected is not None else 0,
        )

    @classmethod
    def from_json(cls, stored: str | None) -> StoredResult | None:
        """``Page.result``'s text read; None when there is none."""
        return cls.from_dict(json.loads(stored)) if stored else None

    @classmethod
    def from_row(cls, page: _Row) -> StoredResult | None:
        """The result of a done page; None for a page not done (or done with nothing stored)."""
        return cls.from_json(page.result) if page.status == DONE else None

    def with_lines(self, lines: list[dict[str, Any]]) -> StoredResult:
        """The reading with only ``lines``, its text theirs."""
        return replace(self, lines=lines, text="\n".join(str(line.get("text", "")) for line in lines))

    def lines_or_text(self) -> list[dict[str, Any]]:
        """The lines that have text; a reading without them (a text layer's) as its text's lines."""
        lines = [line for line in self.lines if str(line.get("text", "")).strip()]
        return lines or [{"text": text} for text in self.text.splitlines() if text.strip()]
