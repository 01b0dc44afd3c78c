"""An incremental update of a PDF (ISO 32000 7.5.6), written a page at a time: what lets a
searchable PDF's build hold memory bounded by a chunk of pages, not by the document.

pikepdf (qpdf) writes a PDF from one in-memory object table: overlaying a text layer on 1,000
pages with ``add_overlay`` and ``save`` grew the process by ~16 kB a page (the copied form
XObjects, their stream-data registrations, the page dictionaries), whatever the text. Here the
original's bytes are copied as they are and each changed page is appended after them: its
dictionary again (same object number) with one more content stream and one more XObject, and the
layer's own objects (the form, its font), then a cross-reference section that points at them and
back (/Prev) at the original's. qpdf is still what reads: the original is opened again for each
chunk of pages (its object cache dropped with it), the layer's chunk too; what stays is 20 bytes a
changed object for the cross-reference.

Not for every file: an encrypted PDF (the appended objects would have to be encrypted) and one
qpdf had to repair (its object numbers are qpdf's, not the file's) raise ``Unsuitable``; the
caller then rewrites the whole file with qpdf.
"""

from __future__ import annotations

import re
import zlib
from array import array
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import BinaryIO

import pikepdf

TAIL_BYTES = 2048  # where startxref is looked for at the file's end


class Unsuitable(Exception):
    """The file cannot be updated in place (encrypted, damaged): rewrite it instead."""


def serialize(
    obj, ref: Callable[[pikepdf.Object], bytes], *, replace: dict[str, bytes] | None = None, itself: bool = False
) -> bytes:
    """``obj`` in PDF syntax; an indirect object in it is written as what ``ref`` says (``n g R``),
    ``obj`` itself too unless ``itself``. A dictionary's ``replace`` entries replace (or add to)
    its own: {key: the value already in PDF syntax}."""
    if isinstance(obj, pikepdf.Object) and obj.is_indirect and not itself:
        return ref(obj)
    if replace is not None or isinstance(obj, pikepdf.Dictionary):
        replace = replace or {}
        kept = b"".join(pikepdf.Name(k).unparse() + b" " + serialize(v, ref) + b" " for k, v in obj.items()
                        if k not in replace)  # fmt: skip
        return b"<<" + kept + b"".join(pikepdf.Name(k).unparse() + b" " + v + b" " for k, v in replace.items()) + b">>"
    if isinstance(obj, pikepdf.Array):
        return b"[" + b" ".join(serialize(v, ref) for v in obj) + b"]"
    if isinstance(obj, pikepdf.Object):  # names, strings
        return obj.unparse()
    if obj is None:
        return b"null"
    if isinstance(obj, bool):
        return b"true" if obj else b"false"
    if isinstance(obj, int):
        return b"%d" % obj
    if isinstance(obj, Decimal | float):
        return format(Decimal(obj).normalize(), "f").encode()
    raise TypeError(f"cannot write {type(obj).__name__} in a PDF")


def same_ref(obj: pikepdf.Object) -> bytes:
    """The original's objects keep their numbers in an update."""
    number, generation = obj.objgen
    return b"%d %d R" % (number, generation)


def inherited(page: pikepdf.Dictionary, key: str):
    """A page attribute that may be on the page or on a /Pages node above it (7.7.3.4)."""
    node, depth = page, 0
    while node is not None and depth < 64:
        if key in node:
            return node[key]
        node, depth = node.get("/Parent"), depth + 1
    return None


def page_dicts(pdf: pikepdf.Pdf, start: int, stop: int) -> Iterator[pikepdf.Dictionary]:
    """Pages ``start`` to ``stop`` (0-based, stop excluded) of the page tree, resolving only the
    nodes on the way (not ``pdf.pages``: qpdf would resolve and keep every page of the file)."""

    def walk(node: pikepdf.Dictionary, first: int, depth: int) -> Iterator[pikepdf.Dictionary]:
        kids = node.get("/Kids")
        if depth > 64 or not isinstance(kids, pikepdf.Array):
            raise Unsuitable("a broken page tree")
        if len(kids) == int(node.get("/Count", -1)):  # leaves only (the usual, flat, tree): skip by index
            for index in range(max(start - first, 0), min(stop - first, len(kids))):
                kid = kids[index]
                if "/Kids" in kid:
                    raise Unsuitable("a page tree whose counts do not add up")
                yield kid
            return
        for kid in kids:
            if first >= stop:
                return
            count = int(kid.get("/Count", 0)) if "/Kids" in kid else 1
            if first + count > start:
                if "/Kids" in kid:
                    yield from walk(kid, first, depth + 1)
                else:
                    yield kid
            first += count

    yield from walk(pdf.Root.Pages, 0, 0)


class Update:
    """An incremental update appended to a copy of a PDF: ``append`` objects (new ones numbered
    from the original's /Size, or an original's number to replace it), then ``close``."""

    def __init__(self, out: BinaryIO, *, size: int, previous: int | None, stream_xref: bool, trailer: dict[str, bytes]):
        self.out, self.next_number, self.previous = out, size, previous
        self.stream_xref, self.trailer = stream_xref, trailer
        self.numbers, self.generations, self.offsets = array("q"), array("l"), array("q")
        self.kids = array("q")  # a new file's pages (new_pdf), in order

    def new_number(self) -> int:
        self.next_number += 1
        return self.next_number - 1

    def append(self, number: int, body: bytes, *, generation: int = 0, stream: bytes | None = None) -> None:
        """Write object ``number``: ``body`` (a stream's dictionary without /Length, when ``stream``)."""
        self.numbers.append(number)
        self.generations.append(generation)
        self.offsets.append(self.out.tell())
        self.out.write(b"%d %d obj\n" % (number, generation))
        if stream is None:
            self.out.write(body + b"\nendobj\n")
            return
        self.out.write(body[:-2] + b"/Length %d>>\nstream\n" % len(stream))
        self.out.write(stream)
        self.out.write(b"\nendstream\nendobj\n")

    def close(self) -> None:
        """The cross-reference section (a table, or a stream when the original's last one was);
        for a new file (``new_pdf``), its page tree and catalogue first."""
        if self.previous is None:
            kids = b" ".join(b"%d 0 R" % kid for kid in self.kids)
            self.append(PAGES, b"<</Type/Pages/Kids[%s]/Count %d>>" % (kids, len(self.kids)))
            self.append(CATALOG, b"<</Type/Catalog/Pages %d 0 R>>" % PAGES)
        if self.stream_xref:
            own = self.new_number()
            self.numbers.append(own)
            self.generations.append(0)
            self.offsets.append(self.out.tell())
        order = sorted(range(len(self.numbers)), key=self.numbers.__getitem__)
        runs: list[tuple[int, list[int]]] = []
        for index in order:
            number = self.numbers[index]
            if runs and runs[-1][0] + len(runs[-1][1]) == number:
                runs[-1][1].append(index)
            elif not runs or runs[-1][0] + len(runs[-1][1]) < number:
                runs.append((number, [index]))  # (a number appended twice keeps its first: never done here)
        trailer = {**self.trailer, "/Size": b"%d" % self.next_number}
        if self.previous is None:
            runs.insert(0, (0, [-1]))  # object 0, the head of the free list
            trailer["/Root"] = b"%d 0 R" % CATALOG
        else:
            trailer["/Prev"] = b"%d" % self.previous
        start = self.out.tell()
        if self.stream_xref:
            rows = b"".join(b"\x01" + self.offsets[i].to_bytes(5, "big") + self.generations[i].to_bytes(2, "big")
                            for _, indexes in runs for i in indexes)  # fmt: skip
            data = zlib.compress(rows)
            index = b" ".join(b"%d %d" % (first, len(indexes)) for first, indexes in runs)
            entries = b"".join(pikepdf.Name(k).unparse() + b" " + v for k, v in trailer.items())
            self.out.write(b"%d 0 obj\n<</Type/XRef/W[1 5 2]/Index[%s]/Filter/FlateDecode/Length %d%s>>\nstream\n"
                           % (own, index, len(data), entries))  # fmt: skip
            self.out.write(data + b"\nendstream\nendobj\n")
        else:
            self.out.write(b"xref\n")
            for first, indexes in runs:
                self.out.write(b"%d %d\n" % (first, len(indexes)))
                self.out.write(b"".join(b"%010d %05d n\r\n" % (self.offsets[i], self.generations[i]) if i >= 0
                                        else b"0000000000 65535 f\r\n" for i in indexes))  # fmt: skip
            entries = b"".join(pikepdf.Name(k).unparse() + b" " + v for k, v in trailer.items())
            self.out.write(b"trailer\n<<" + entries + b">>\n")
        self.out.write(b"startxref\n%d\n%%%%EOF\n" % start)


def open_update(source: Path, pdf: pikepdf.Pdf, out: BinaryIO) -> Update:
    """Copy ``source`` (opened as ``pdf``) into ``out`` and start its update; Unsuitable when it
    cannot be updated in place."""
    if pdf.is_encrypted:
        raise Unsuitable("encrypted")
    if warnings := pdf.get_warnings():  # (each call takes them: the next answers [])
        raise Unsuitable(f"qpdf repaired it: {warnings[0]}")
    with source.open("rb") as f:
        f.seek(0, 2)
        length = f.tell()
        f.seek(max(0, length - TAIL_BYTES))
        found = re.findall(rb"startxref\s+(\d+)\s+%%EOF", f.read())
        if not found or int(found[-1]) >= length:
            raise Unsuitable("no startxref at its end")
        previous = int(found[-1])
        f.seek(previous)
        stream_xref = not f.read(4).startswith(b"xref")
        f.seek(0)
        while chunk := f.read(1 << 20):
            out.write(chunk)
    out.write(b"\n")
    trailer = {key: serialize(pdf.trailer[key], same_ref) for key in ("/Root", "/Info", "/ID") if key in pdf.trailer}
    return Update(out, size=int(pdf.trailer.Size), previous=previous, stream_xref=stream_xref, trailer=trailer)


CATALOG, PAGES = 1, 2  # a new file's first objects, written last


def new_pdf(out: BinaryIO) -> Update:
    """A new PDF written a page at a time (``Copier.add_page``), its page tree at the end."""
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    return Update(out, size=PAGES + 1, previous=None, stream_xref=False, trailer={})


class Copier:
    """Copies objects of another PDF (the text layer's) into an update, each once, renumbered."""

    def __init__(self, update: Update) -> None:
        self.update, self.numbers, self.waiting = update, {}, []

    def ref(self, obj: pikepdf.Object) -> bytes:
        key = obj.objgen
        if key not in self.numbers:
            self.numbers[key] = self.update.new_number()
            self.waiting.append(obj)
        return b"%d 0 R" % self.numbers[key]

    def write(self, obj, *, stream: bytes | None = None, replace: dict[str, bytes] | None = None) -> bytes:
        """Write ``obj`` (a dictionary, or a stream's, with ``stream`` its encoded bytes; ``replace``:
        as ``serialize``'s) as a new object, and every object it refers to that is not written
        yet; its ``n 0 R``."""
        number = self.update.new_number()
        self.update.append(number, serialize(obj, self.ref, replace=replace, itself=True), stream=stream)
        while self.waiting:
            other = self.waiting.pop()
            if isinstance(other, pikepdf.Stream):
                dictionary = pikepdf.Dictionary({k: v for k, v in other.stream_dict.items() if k != "/Length"})
                self.update.append(self.numbers[other.objgen], serialize(dictionary, self.ref),
                                   stream=other.read_raw_bytes())  # fmt: skip
            else:
                self.update.append(self.numbers[other.objgen], serialize(other, self.ref, itself=True))
        return b"%d 0 R" % number

    def add_page(self, page: pikepdf.Dictionary) -> None:
        """Copy a page of another PDF as the next page of a new file (``new_pdf``), with what it
        inherits from its page tree made its own."""
        replace = {"/Parent": b"%d 0 R" % PAGES}
        for key in ("/Resources", "/MediaBox", "/CropBox", "/Rotate"):
            if key not in page and (value := inherited(page, key)) is not None:
                replace[key] = serialize(value, self.ref)
        self.update.kids.append(int(self.write(page, replace=replace).split()[0]))
