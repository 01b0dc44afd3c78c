"""hOCR and ALTO XML per document (issue 40, item 5): made from the stored page results, a page at
a time, valid as each format's element tree says, with each word where its line's box puts it."""

from __future__ import annotations

import re

import pytest
from lxml import etree

from ocrjobs.services.layout_xml import document_alto, document_hocr
from tests.factories import PAGES_TRUTH, pdf_bytes
from tests.helpers import auth
from tests.ocrjobs.helpers import complete_all, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")

ALTO = "{http://www.loc.gov/standards/alto/ns-v4#}"
XHTML = "{http://www.w3.org/1999/xhtml}"
FIRST = {"text": "Water levels & <rose>", "bbox": [100, 40, 310, 80], "confidence": 87.4}  # 21 characters
TURNED = {"text": "up the page", "bbox": [500, 100, 540, 320], "confidence": 70.0, "angle": 90.0}


@pytest.fixture
def read_job(ordinary_user):
    """Three pages: one read with a level line and one on its side, one read by a vlm (no boxes),
    one failed."""
    job = submit(ordinary_user, {"report.pdf": pdf_bytes([PAGES_TRUTH[0]] * 4)})
    split(job)
    vlm = {"text": "first stacked\nsecond stacked", "lines": [{"text": "first stacked", "bbox": None},
           {"text": "second stacked", "bbox": None}], "confidence": 80.0, "width": 800, "height": 1000}  # fmt: skip
    results = {(0, 1): {"text": "", "lines": [FIRST, TURNED], "confidence": 90.0, "width": 1000, "height": 1400},
               (0, 2): vlm, (0, 4): {"text": "", "lines": [], "confidence": 0.0, "width": 1000, "height": 1400}}  # fmt: skip
    complete_all(job, results=results, failures={(0, 3): "pod exploded"})
    return job


def hocr_of(job):
    return etree.fromstring("".join(document_hocr(job.documents.get())).encode())


def alto_of(job):
    return etree.fromstring("".join(document_alto(job.documents.get())).encode())


def title(element) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in element.get("title").split(";"))


def box(element) -> list[int]:
    return [int(v) for v in title(element)["bbox"].split()]


def by_class(tree, name):
    return tree.findall(f".//*[@class='{name}']")


def test_hocr_has_a_page_each_its_lines_and_words_with_boxes_and_confidence(read_job):
    tree = hocr_of(read_job)

    assert tree.tag == f"{XHTML}html"
    assert tree.find(f".//{XHTML}meta[@name='ocr-capabilities']").get("content") == "ocr_page ocr_line ocrx_word"
    pages = by_class(tree, "ocr_page")
    assert [p.get("id") for p in pages] == ["page_1", "page_2", "page_3", "page_4"]
    assert box(pages[0]) == [0, 0, 1000, 1400] and title(pages[0])["ppageno"] == "0"
    assert "bbox" not in title(pages[2]) and len(pages[2]) == 0  # failed: an empty page
    first, turned = by_class(pages[0], "ocr_line")
    assert box(first) == FIRST["bbox"]
    words = by_class(first, "ocrx_word")
    assert [w.text for w in words] == ["Water", "levels", "&", "<rose>"]  # escaped, and read back
    assert [box(w) for w in words] == [[100, 40, 150, 80], [160, 40, 220, 80], [230, 40, 240, 80],
                                       [250, 40, 310, 80]]  # fmt: skip
    assert {title(w)["x_wconf"] for w in words} == {"87"}
    assert title(turned)["textangle"] == "90"
    up = [box(w) for w in by_class(turned, "ocrx_word")]
    assert up[0][3] == 320 and up[-1][1] == 100 and up[0][1] > up[-1][3]  # the first word at the bottom


def test_hocr_gives_a_line_without_a_box_a_band_of_its_page(read_job):
    page = by_class(hocr_of(read_job), "ocr_page")[1]

    assert [box(line) for line in by_class(page, "ocr_line")] == [[0, 0, 800, 500], [0, 500, 800, 1000]]
    assert [w.text for w in by_class(page, "ocrx_word")] == ["first", "stacked", "second", "stacked"]


def test_alto_follows_the_v4_element_tree_with_positions_and_word_confidence(read_job):
    tree = alto_of(read_job)

    assert tree.tag == f"{ALTO}alto"
    assert "alto-4" in tree.get("{http://www.w3.org/2001/XMLSchema-instance}schemaLocation")
    assert [child.tag for child in tree] == [f"{ALTO}Description", f"{ALTO}Layout"]
    assert tree.findtext(f"{ALTO}Description/{ALTO}MeasurementUnit") == "pixel"
    pages = tree.findall(f"{ALTO}Layout/{ALTO}Page")
    assert [(p.get("ID"), p.get("PHYSICAL_IMG_NR")) for p in pages] == [(f"page_{n}", str(n)) for n in (1, 2, 3, 4)]
    assert (pages[0].get("WIDTH"), pages[0].get("HEIGHT"), pages[0].get("PC")) == ("1000", "1400", "0.90")
    assert len(pages[2]) == 0 and pages[2].get("WIDTH") is None  # failed
    assert [child.tag for child in pages[3]] == [f"{ALTO}PrintSpace"] and len(pages[3][0]) == 0  # read, blank
    for page in pages[:2]:
        assert [child.tag for child in page] == [f"{ALTO}PrintSpace"]
        for block in page[0]:
            assert block.tag == f"{ALTO}TextBlock"
            for line in block:
                assert line.tag == f"{ALTO}TextLine"
                assert {child.tag for child in line} <= {f"{ALTO}String", f"{ALTO}SP"}
                for element in (block, line, *line.findall(f"{ALTO}String")):
                    assert all(re.fullmatch(r"\d+", element.get(k)) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
    line = pages[0].find(f".//{ALTO}TextLine")
    assert [line.get(k) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT")] == ["100", "40", "210", "40"]
    strings = line.findall(f"{ALTO}String")
    assert [s.get("CONTENT") for s in strings] == ["Water", "levels", "&", "<rose>"]
    assert [(s.get("HPOS"), s.get("WIDTH"), s.get("WC")) for s in strings][:2] == [("100", "50", "0.87"),
                                                                                  ("160", "60", "0.87")]  # fmt: skip
    assert len(line.findall(f"{ALTO}SP")) == 3
    block = pages[0].find(f".//{ALTO}TextBlock")
    assert [block.get(k) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT")] == ["100", "40", "440", "280"]


def test_the_xml_is_made_a_page_at_a_time(read_job):
    parts = list(document_alto(read_job.documents.get()))

    assert len(parts) == 2 + 4 + 1  # declaration, head, a part a page, the end
    assert "page_1" in parts[2] and "page_2" not in parts[2]


@pytest.mark.parametrize(("suffix", "content_type", "root"), [("hocr", "text/html", "html"),
                                                               ("alto.xml", "application/xml", "alto")])  # fmt: skip
def test_the_api_streams_each_documents_hocr_and_alto(client, submit_token, read_job, suffix, content_type, root):
    document = read_job.documents.get()
    job = client.get(f"/v1/jobs/{read_job.pk}", headers=auth(submit_token)).json()
    key = suffix.split(".")[0]
    url = f"/v1/jobs/{read_job.pk}/documents/{document.pk}/result.{suffix}"
    assert job["documents"][0]["outputs"][key] == url

    response = client.get(url, headers=auth(submit_token))

    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == f"{content_type}; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="report.{suffix}"'
    assert etree.fromstring(b"".join(response.streaming_content)).tag.endswith(root)
