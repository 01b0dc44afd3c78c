// The job page's side of its websocket (ocrjobs/live.py): it tells the server which viewer pages
// it holds and in which state (data-page, data-state), so that only the pages it shows are
// pushed, and only when they move; and whether its viewer waits for the first pages (data-fill).
// It says it again on every (re)connection, after each batch it loads as you scroll, and after
// each push (a page pushed carries its new state).
(function () {
  var socket = null;
  var reported = {};

  function report() {
    if (!socket) return;
    var pages = {};
    var changed = false;
    document.querySelectorAll("#viewer .viewer-page[data-page]").forEach(function (article) {
      var id = article.dataset.page;
      if (reported[id] !== article.dataset.state) {
        pages[id] = reported[id] = article.dataset.state;
        changed = true;
      }
    });
    var fill = document.querySelector("#viewer-pages[data-fill]") !== null;
    if (changed || fill) socket.send(JSON.stringify({ pages: pages, fill: fill }));
  }

  document.addEventListener("htmx:wsOpen", function (e) {
    socket = e.detail.socketWrapper;
    reported = {};
    report();
  });
  document.addEventListener("htmx:wsClose", function () { socket = null; });
  document.addEventListener("htmx:afterSettle", report);
  document.addEventListener("htmx:wsAfterMessage", report);
})();
