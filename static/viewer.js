// The job page's page viewer (templates/ocrjobs/viewer.html): draws each PDF page with pdf.js
// (the vendored ES module build, static/vendor/README.md) when it comes into view, renders the vlm
// engine's Markdown (marked, then DOMPurify), lays out each page's lines (boxes over the page, the
// text beside it) from what the server placed as shares of the page's size, and highlights a line
// in the page and in the text together.
const viewer = document.getElementById("viewer");

if (viewer) {
  const documents = new Map(); // document URL -> pdf.js document (a promise), loaded once
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
    const pdf = await pdfDocument(article.dataset.pdf);
    const page = await pdf.getPage(Number(article.dataset.number));
    const base = page.getViewport({ scale: 1 });
    // The sheet takes the page's own proportions; the boxes are percent of it.
    sheet.style.aspectRatio = `${base.width} / ${base.height}`;
    const ratio = window.devicePixelRatio || 1;
    const viewport = page.getViewport({ scale: (sheet.clientWidth / base.width) * ratio });
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
  // has one, and the text beside it, both carrying the line's number and confidence band.
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
        const [left, top, width, height] = line.box;
        Object.assign(box.style, { left: `${left}%`, top: `${top}%`, width: `${width}%`, height: `${height}%` });
        box.title = line.conf === null ? line.text : `${line.text} (${Math.round(line.conf)})`;
        boxes.append(box);
      }
      const item = document.createElement("li");
      item.className = `band-${line.band}`;
      item.dataset.line = line.n;
      item.tabIndex = 0;
      item.textContent = line.text;
      if (line.conf !== null) {
        const confidence = document.createElement("span");
        confidence.className = "conf";
        confidence.textContent = ` ${Math.round(line.conf)}`;
        item.append(confidence);
      }
      list.append(item);
    }
    article.dataset.lines = "drawn";
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
  viewer.addEventListener("click", (event) => select(event.target));
  viewer.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      select(event.target);
    }
  });

  watch(viewer);
  // Each batch htmx brings in as the last page comes into view, and the pages the job page's
  // websocket pushes as they change (ocrjobs/live.py): new elements, drawn when in view.
  document.body.addEventListener("htmx:afterSettle", () => watch(viewer));
  document.body.addEventListener("htmx:wsAfterMessage", () => watch(viewer));
}
