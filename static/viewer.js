// The job page's page viewer (templates/ocrjobs/viewer.html): draws each PDF page with pdf.js
// (the vendored ES module build, static/vendor/README.md) when it comes into view, renders the vlm
// engine's Markdown (marked, then DOMPurify), lays out each page's lines (boxes over the page, the
// text beside it) from what the server placed as shares of the page's size, and highlights a line
// in the page and in the text together. For reviewing (issue 42, item 7): zoom (the boxes are
// shares of the sheet, so they stay on their words), keys to step through the lines to check and
// to go to a page, lines and boxes each one tab stop a page (a roving tabindex), and a line's
// correction posted with the CSRF token (ocrjobs/viewer_views.py job_line_correct).
const viewer = document.getElementById("viewer");

if (viewer) {
  const documents = new Map(); // document URL -> pdf.js document (a promise), loaded once
  const MAX_CANVAS_PIXELS = 16_000_000;
  let pdfjs = null;
  let markdown = null;

  function loadPdfjs() {
    pdfjs ??= import(viewer.dataset.pdfjs).then((lib) => {
      lib.GlobalWorkerOptions.workerSrc = viewer.dataset.pdfjsWorker;
      return lib;
    });
    return pdfjs;
  }

  function pdfDocument(url) {
    if (!documents.has(url)) {
      // Ranges: a long PDF's pages are read without fetching all of it (the view answers 206).
      // The PDF is the document's author's: pdf.js runs none of its JavaScript (no scripting, no
      // XFA), and compiles nothing of it as script. isEvalSupported is the switch for that in the
      // pdf.js versions that had it (before 5; this one compiles a PostScript function to
      // WebAssembly or walks it: tests/fleetadmin/test_csp.py), and the CSP refuses eval in the
      // page and in pdf.js's worker whatever a version does (fleetadmin/staticpolicy.py).
      documents.set(url, loadPdfjs().then((lib) => lib.getDocument({
        url, wasmUrl: viewer.dataset.pdfjsWasm, disableStream: true, disableAutoFetch: true,
        isEvalSupported: false, enableXfa: false,
      }).promise));
    }
    return documents.get(url);
  }

  async function drawPdfPage(article) {
    const sheet = article.querySelector(".viewer-sheet");
    const canvas = sheet.querySelector("canvas");
    article.dataset.drawn = "drawing";
    const pdf = await pdfDocument(article.dataset.pdf);
    const page = await pdf.getPage(Number(article.dataset.number));
    const base = page.getViewport({ scale: 1 });
    // The sheet takes the page's own proportions; the boxes are percent of it.
    sheet.style.aspectRatio = `${base.width} / ${base.height}`;
    const ratio = window.devicePixelRatio || 1;
    // Zoomed in, a canvas is held to MAX_CANVAS_PIXELS (the browser refuses bigger ones).
    const wanted = (sheet.clientWidth / base.width) * ratio;
    const scale = Math.min(wanted, Math.sqrt(MAX_CANVAS_PIXELS / (base.width * base.height)));
    const viewport = page.getViewport({ scale });
    canvas.width = Math.floor(viewport.width);
    canvas.height = Math.floor(viewport.height);
    await page.render({ canvas, viewport }).promise;
    page.cleanup();
    article.dataset.drawn = "true";
  }

  // What the model's Markdown may show (issue 38, N3): it is the document's author's text, or a
  // compromised pod's. Text structure only: no style, form, input, button, image, media, frame,
  // id, class or data attribute; links to http(s) and mailto only, opened apart from this page.
  const MARKDOWN_ALLOWED = {
    ALLOWED_TAGS: [
      "h1", "h2", "h3", "h4", "h5", "h6", "p", "br", "hr", "blockquote", "pre", "code",
      "strong", "b", "em", "i", "del", "s", "sub", "sup", "mark",
      "ul", "ol", "li", "dl", "dt", "dd",
      "table", "caption", "thead", "tbody", "tfoot", "tr", "th", "td", "a",
    ],
    ALLOWED_ATTR: ["href", "title", "colspan", "rowspan", "start", "align"],
    ALLOW_DATA_ATTR: false,
    ALLOW_ARIA_ATTR: false,
    ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|#)/i,
  };

  function markdownSanitizer(purify) {
    purify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A" && node.hasAttribute("href")) {
        node.setAttribute("rel", "noopener noreferrer nofollow");
        node.setAttribute("target", "_blank");
      }
    });
    return (html) => purify.sanitize(html, MARKDOWN_ALLOWED);
  }

  async function renderMarkdown(element) {
    markdown ??= Promise.all([import(viewer.dataset.marked), import(viewer.dataset.purify)])
      .then(([marked, purify]) => [marked, markdownSanitizer(purify.default)]);
    const [marked, sanitize] = await markdown;
    // The model's Markdown may hold HTML (its tables): only what the allow-list keeps is shown.
    element.innerHTML = sanitize(marked.parse(element.textContent));
    element.classList.add("rendered");
  }

  // The page's lines (a json_script the server wrote): a box over the page for each line that
  // has one, and the text beside it, both carrying the line's number and confidence band. The
  // lines of a page are one tab stop, its boxes another (a roving tabindex: the arrows move).
  function drawLines(article) {
    const data = article.querySelector("script[id^='viewer-lines-']");
    if (!data || article.dataset.lines === "drawn") return;
    const boxes = article.querySelector(".viewer-boxes");
    const list = article.querySelector("ol.lines");
    for (const line of JSON.parse(data.textContent)) {
      if (line.box && boxes) {
        const box = document.createElement("div");
        box.className = `box band-${line.band}`;
        box.dataset.line = line.n;
        box.tabIndex = boxes.childElementCount ? -1 : 0;
        box.setAttribute("role", "button");
        const [left, top, width, height] = line.box;
        Object.assign(box.style, { left: `${left}%`, top: `${top}%`, width: `${width}%`, height: `${height}%` });
        boxes.append(box);
      }
      const item = document.createElement("li");
      item.className = `band-${line.band}`;
      item.dataset.line = line.n;
      item.dataset.conf = line.conf === null ? "" : Math.round(line.conf);
      item.tabIndex = list.childElementCount ? -1 : 0;
      const text = document.createElement("span");
      text.className = "text";
      item.append(text);
      if (line.conf !== null) {
        const confidence = document.createElement("span");
        confidence.className = "conf";
        confidence.textContent = ` ${Math.round(line.conf)}`;
        item.append(confidence);
      }
      list.append(item);
      showLine(article, item, { text: line.text, engine: line.engine, check: line.check });
    }
    article.dataset.lines = "drawn";
  }

  // A line's text, marks and labels, in the list and on its box: as read, or as corrected.
  function showLine(article, item, { text, engine, check }) {
    item.dataset.text = text;
    item.querySelector(".text").textContent = text;
    item.classList.toggle("to-check", Boolean(check));
    item.classList.toggle("corrected", engine !== null && engine !== undefined);
    const read = engine !== null && engine !== undefined ? ` (corrected; the engine read: ${engine})` : "";
    item.title = read ? read.trim() : "";
    const box = article.querySelector(`.box[data-line="${item.dataset.line}"]`);
    if (box) {
      box.classList.toggle("corrected", Boolean(read));
      const confidence = item.dataset.conf === "" ? "" : `, confidence ${item.dataset.conf}`;
      box.title = `${text}${read}`;
      box.setAttribute("aria-label", `line ${Number(item.dataset.line) + 1}: ${text}${confidence}${read}`);
    }
  }

  const onScreen = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      onScreen.unobserve(entry.target);
      const article = entry.target;
      drawLines(article);
      if (article.dataset.pdf) {
        drawPdfPage(article).catch((error) => {
          article.dataset.drawn = "failed";
          article.querySelector(".viewer-sheet").dataset.error = `the page could not be drawn: ${error}`;
        });
      }
      for (const element of article.querySelectorAll("[data-markdown]:not(.rendered)")) renderMarkdown(element);
    }
  }, { rootMargin: "600px 0px" });

  // A drawn page more than a screen away gives its pixels back (3,000 drawn canvases would hold
  // gigabytes) and is drawn again when it comes near; its sheet keeps its size meanwhile.
  const farAway = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const article = entry.target;
      if (entry.isIntersecting || article.dataset.drawn !== "true") continue;
      const canvas = article.querySelector("canvas");
      canvas.width = 0;
      canvas.height = 0;
      article.dataset.drawn = "freed";
      onScreen.observe(article);
    }
  }, { rootMargin: "100% 0px" });

  function watch(root) {
    for (const article of root.querySelectorAll(".viewer-page:not([data-watched])")) {
      article.dataset.watched = "true";
      onScreen.observe(article);
      if (article.dataset.pdf) farAway.observe(article);
    }
  }

  // A line is highlighted in the page and in the text at once: on hover, and kept on a click.
  function lineElements(target) {
    const line = target.closest("[data-line]");
    if (!line) return [];
    const article = line.closest(".viewer-page");
    return [...article.querySelectorAll(`[data-line="${line.dataset.line}"]`)];
  }

  viewer.addEventListener("mouseover", (event) => {
    for (const element of lineElements(event.target)) element.classList.add("hl");
  });
  viewer.addEventListener("mouseout", (event) => {
    for (const element of lineElements(event.target)) element.classList.remove("hl");
  });
  function select(target) {
    const elements = lineElements(target);
    if (!elements.length) return;
    const wasSelected = elements[0].classList.contains("selected");
    for (const element of viewer.querySelectorAll(".selected")) element.classList.remove("selected");
    if (wasSelected) return;
    for (const element of elements) element.classList.add("selected");
    const text = elements.find((element) => element.tagName === "LI");
    if (text && !target.closest("li")) text.scrollIntoView({ block: "nearest" });
  }
  viewer.addEventListener("click", (event) => {
    if (!event.target.closest("form, button, input")) select(event.target);
  });
  viewer.addEventListener("dblclick", (event) => {
    const line = event.target.closest("li[data-line], .box[data-line]");
    if (line) edit(textOf(line));
  });

  // --- one tab stop a page's lines, another its boxes: the arrows move between them ---------------

  function rove(element) {
    for (const other of element.parentElement.children) other.tabIndex = other === element ? 0 : -1;
  }

  function textOf(element) {
    if (element.tagName === "LI") return element;
    return element.closest(".viewer-page").querySelector(`li[data-line="${element.dataset.line}"]`);
  }

  viewer.addEventListener("focusin", (event) => {
    const line = event.target.closest?.("li[data-line], .box[data-line]");
    if (!line || event.target.closest("form")) return;
    rove(line);
    for (const element of lineElements(line)) element.classList.add("focused");
  });
  viewer.addEventListener("focusout", (event) => {
    const line = event.target.closest?.("li[data-line], .box[data-line]");
    if (line) for (const element of lineElements(line)) element.classList.remove("focused");
  });

  viewer.addEventListener("keydown", (event) => {
    const line = event.target.closest("li[data-line], .box[data-line]");
    if (!line || event.target.closest("form")) return;
    const siblings = [...line.parentElement.children];
    const at = siblings.indexOf(line);
    const to = { ArrowDown: at + 1, ArrowRight: at + 1, ArrowUp: at - 1, ArrowLeft: at - 1, Home: 0,
                 End: siblings.length - 1 }[event.key];
    if (to !== undefined) {
      event.preventDefault();
      const next = siblings[Math.max(0, Math.min(siblings.length - 1, to))];
      rove(next);
      next.focus();
      next.scrollIntoView({ block: "nearest", inline: "nearest" });
    } else if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      select(event.target);
    }
  });

  // --- zoom: the sheet is a share of its column's width, its boxes shares of the sheet -----------

  const ZOOM_STEP = 1.25;
  const ZOOM_MIN = 0.5;
  const ZOOM_MAX = 8;
  const zoomShown = document.getElementById("viewer-zoom");
  let zoom = 1; // of the width that fits
  let redraw = null;

  function pageInView() {
    const focused = document.activeElement?.closest?.(".viewer-page");
    if (focused && viewer.contains(focused)) return focused;
    const pages = [...viewer.querySelectorAll(".viewer-page")];
    return pages.find((article) => article.getBoundingClientRect().bottom > 80) || pages[0];
  }

  function setZoom(next) {
    const article = pageInView();
    zoom = Math.min(ZOOM_MAX, Math.max(ZOOM_MIN, next));
    viewer.style.setProperty("--zoom", zoom);
    viewer.classList.toggle("zoomed", zoom !== 1);
    const sheet = article?.querySelector(".viewer-sheet");
    const read = Number(sheet?.dataset.readWidth);
    const shown = sheet?.getBoundingClientRect().width;
    zoomShown.textContent = zoom === 1 ? "fit" : read ? `${Math.round((shown / read) * 100)}%` : `${zoom}×`;
    article?.scrollIntoView({ block: "start" });
    // Drawn pages are drawn again at their new size once the zoom settles (sharp, not stretched).
    clearTimeout(redraw);
    redraw = setTimeout(() => {
      for (const page of viewer.querySelectorAll(".viewer-page[data-drawn='true']")) {
        drawPdfPage(page).catch(() => {});
      }
    }, 200);
  }

  function zoomTo(action) {
    if (action === "in") setZoom(zoom * ZOOM_STEP);
    else if (action === "out") setZoom(zoom / ZOOM_STEP);
    else if (action === "fit") setZoom(1);
    else if (action === "actual") {
      // One pixel the pod read, one CSS pixel shown: the width read over the width that fits.
      const sheet = pageInView()?.querySelector(".viewer-sheet");
      const read = Number(sheet?.dataset.readWidth);
      if (!sheet || !read) {
        say("This page has no size read: it fits the width.");
        return;
      }
      // Twice: the first may bring the sheet's box a scroll bar, which narrows what it is a share of.
      for (let pass = 0; pass < 2; pass++) setZoom((zoom * read) / sheet.getBoundingClientRect().width);
    }
  }

  // --- lines to check, pages, keys -------------------------------------------------------------

  const status = document.getElementById("viewer-status");
  function say(message) {
    status.textContent = message;
  }

  function loadMore() {
    const more = viewer.querySelector(".viewer-more");
    if (more) more.scrollIntoView({ block: "end" }); // htmx loads it once it is revealed
    return Boolean(more);
  }

  function step(direction) {
    for (const article of viewer.querySelectorAll(".viewer-page")) drawLines(article);
    const lines = [...viewer.querySelectorAll("ol.lines li.to-check")];
    const focused = document.activeElement?.closest?.("li[data-line], .box[data-line]");
    const current = focused && viewer.contains(focused) ? textOf(focused) : null;
    let index = direction > 0 ? 0 : lines.length - 1;
    if (current) {
      const after = (li) => current.compareDocumentPosition(li) & Node.DOCUMENT_POSITION_FOLLOWING;
      index = direction > 0 ? lines.findIndex(after) : lines.findLastIndex((li) => li !== current && !after(li));
    }
    if (!lines.length || index < 0) {
      if (direction > 0 && loadMore()) say("The next pages are loading: press again for their lines to check.");
      else say(direction > 0 ? "No line to check after this one." : "No line to check before this one.");
      return;
    }
    const li = lines[index];
    const box = li.closest(".viewer-page").querySelector(`.box[data-line="${li.dataset.line}"]`);
    box?.scrollIntoView({ block: "nearest", inline: "center" });
    li.scrollIntoView({ block: "center" });
    rove(li);
    li.focus({ preventScroll: true });
    say(`Line to check ${index + 1} of ${lines.length} in the pages loaded: ${li.dataset.text}`);
  }

  let pendingPage = null; // a page asked for that a batch still to load may hold
  let lastGone = null; // the page gone to last
  // A job of several documents has a page N in each: Go again takes the next one loaded.
  function goToPage(number) {
    const found = [...viewer.querySelectorAll(`.viewer-page[data-page-number="${number}"]`)];
    const index = (found.indexOf(lastGone) + 1) % Math.max(1, found.length);
    const article = found[index];
    if (article) {
      pendingPage = null;
      lastGone = article;
      article.scrollIntoView({ block: "start" });
      article.focus({ preventScroll: true });
      say(`${article.getAttribute("aria-label")}${found.length > 1 ? ` (${index + 1} of ${found.length} pages ${number} loaded: Go again for the next)` : ""}.`);
    } else if (loadMore()) {
      pendingPage = number;
      say(`Loading the next pages to find page ${number}…`);
    } else {
      pendingPage = null;
      say(`There is no page ${number}${viewer.querySelector(".viewer-filter strong")?.textContent.startsWith("To check") ? " among the pages to check" : ""}.`);
    }
  }

  const gotoForm = document.getElementById("viewer-goto");
  gotoForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const number = Number(gotoForm.elements.page.value);
    if (Number.isInteger(number) && number > 0) goToPage(number);
    else say("Type a page number (1 or more).");
  });
  viewer.querySelector(".viewer-tools").addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (button?.dataset.zoom) zoomTo(button.dataset.zoom);
    if (button?.dataset.step) step(Number(button.dataset.step));
  });

  const help = document.getElementById("viewer-keys");
  const KEYS = { j: () => step(1), n: () => step(1), k: () => step(-1), p: () => step(-1),
                 "+": () => zoomTo("in"), "=": () => zoomTo("in"), "-": () => zoomTo("out"),
                 0: () => zoomTo("fit"), 1: () => zoomTo("actual"), "?": () => { help.open = !help.open; },
                 g: () => gotoForm.elements.page.focus(),
                 e: () => { const line = document.activeElement?.closest?.("li[data-line], .box[data-line]");
                            if (line && viewer.contains(line)) edit(textOf(line)); } };  // prettier-ignore
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape") {
      if (help.open) help.open = false;
      else if (document.activeElement === gotoForm.elements.page) document.activeElement.blur();
      else for (const element of viewer.querySelectorAll(".selected")) element.classList.remove("selected");
      return;
    }
    if (event.target.closest?.("input, textarea, select, [contenteditable]")) return;
    const action = KEYS[event.key];
    if (action) {
      event.preventDefault();
      action();
    }
  });

  // --- corrections ---------------------------------------------------------------------------

  function csrfToken() {
    try {
      return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || "";
    } catch {
      return "";
    }
  }

  function edit(item) {
    if (!item || !viewer.dataset.correct || item.querySelector("form")) return;
    const article = item.closest(".viewer-page");
    const number = Number(item.dataset.line) + 1;
    const form = document.createElement("form");
    form.className = "correct";
    const input = document.createElement("input");
    Object.assign(input, { name: "text", value: item.dataset.text, maxLength: 2000, required: true });
    input.setAttribute("aria-label", `Correct line ${number}`);
    const save = Object.assign(document.createElement("button"), { type: "submit", textContent: "Save" });
    const cancel = Object.assign(document.createElement("button"), { type: "button", textContent: "Cancel" });
    const error = Object.assign(document.createElement("p"), { className: "error" });
    error.setAttribute("role", "alert");
    error.id = `correct-error-${article.dataset.pageId}-${item.dataset.line}`;
    input.setAttribute("aria-describedby", error.id);
    form.append(input, save, cancel, error);
    item.classList.add("editing");
    item.append(form);
    input.focus();
    input.select();

    function close() {
      form.remove();
      item.classList.remove("editing");
      item.focus();
    }
    cancel.addEventListener("click", close);
    form.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        event.stopPropagation();
        close();
        say(`Line ${number} left as it was.`);
      }
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      save.disabled = true;
      try {
        const url = `${viewer.dataset.correct}${article.dataset.pageId}/lines/${item.dataset.line}`;
        const response = await fetch(url, { method: "POST", body: new FormData(form), credentials: "same-origin",
                                             headers: { "X-CSRFToken": csrfToken() } });  // prettier-ignore
        const answer = await response.json().catch(() => ({ error: `the server answered ${response.status}` }));
        if (!response.ok) {
          error.textContent = answer.error || `the server answered ${response.status}`;
          input.setAttribute("aria-invalid", "true");
          input.focus();
          return;
        }
        const wasToCheck = item.classList.contains("to-check");
        showLine(article, item, { text: answer.text, engine: answer.engine_text, check: false });
        if (wasToCheck) countChecked(article);
        close();
        say(`Line ${number} corrected; the engine's reading is kept: ${answer.engine_text}`);
      } catch (failure) {
        error.textContent = `not saved: ${failure}`;
      } finally {
        save.disabled = false;
      }
    });
  }

  // A line to check that was corrected is checked: one fewer on its page and in the job.
  function countChecked(article) {
    for (const counter of [article.querySelector(".chip.lines-to-check"), document.getElementById("viewer-lines-count")]) {
      const count = Number.parseInt(counter?.textContent, 10);
      if (!counter || !Number.isFinite(count)) continue;
      counter.textContent = counter.textContent.replace(/^\d+ lines?/, `${count - 1} line${count - 1 === 1 ? "" : "s"}`);
    }
  }

  watch(viewer);
  // Each batch htmx brings in as the last page comes into view, and the pages the job page's
  // websocket pushes as they change (ocrjobs/live.py): new elements, drawn when in view.
  document.body.addEventListener("htmx:afterSettle", () => {
    watch(viewer);
    if (pendingPage !== null) goToPage(pendingPage);
  });
  document.body.addEventListener("htmx:wsAfterMessage", () => watch(viewer));
}
