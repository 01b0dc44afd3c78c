// The job page's page viewer (templates/ocrjobs/viewer.html): draws each PDF page with pdf.js
// (the vendored ES module build, static/vendor/README.md) when it comes into view, renders the vlm
// engine's Markdown (marked, then DOMPurify), and highlights a line in the page and in the text
// together. The boxes are placed by the server as shares of the page's size; this only draws.
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
      documents.set(url, loadPdfjs().then((lib) => lib.getDocument({
        url, wasmUrl: viewer.dataset.pdfjsWasm, disableStream: true, disableAutoFetch: true,
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
    article.dataset.drawn = "true";
  }

  async function renderMarkdown(element) {
    markdown ??= Promise.all([import(viewer.dataset.marked), import(viewer.dataset.purify)]);
    const [marked, purify] = await markdown;
    // The model's Markdown may hold HTML (its tables): only what DOMPurify keeps is shown.
    element.innerHTML = purify.default.sanitize(marked.parse(element.textContent));
    element.classList.add("rendered");
  }

  const onScreen = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      onScreen.unobserve(entry.target);
      const article = entry.target;
      if (article.dataset.pdf) {
        drawPdfPage(article).catch((error) => {
          article.dataset.drawn = "failed";
          article.querySelector(".viewer-sheet").dataset.error = `the page could not be drawn: ${error}`;
        });
      }
      for (const element of article.querySelectorAll("[data-markdown]:not(.rendered)")) renderMarkdown(element);
    }
  }, { rootMargin: "600px 0px" });

  function watch(root) {
    for (const article of root.querySelectorAll(".viewer-page:not([data-watched])")) {
      article.dataset.watched = "true";
      onScreen.observe(article);
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
  // Each batch htmx brings in as the last page comes into view.
  document.body.addEventListener("htmx:afterSettle", () => watch(viewer));
}
