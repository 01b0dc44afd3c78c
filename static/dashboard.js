// The dashboard's only script: remember whether the websocket is open, so that
// the fallback poll (hx-trigger filter on #dash-poll) runs only without it.
(function () {
  function mark(state) { document.body.dataset.live = state; }
  document.addEventListener("htmx:wsOpen", function () { mark("on"); });
  document.addEventListener("htmx:wsClose", function () { mark("off"); });
  document.addEventListener("htmx:wsError", function () { mark("off"); });
})();
