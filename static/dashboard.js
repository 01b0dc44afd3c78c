// The live pages' script (the dashboard, a job's page): remember whether the websocket is open,
// so that the fallback poll (#dash-poll, #job-poll: data-fallback-poll, every 10 s) is sent only
// without it; and reload the page when the server closes the websocket because the session has
// ended (4401: logged out, here or in another tab), which leads to the login page.
(function () {
  var SESSION_ENDED = 4401;
  function mark(state) { document.body.dataset.live = state; }
  document.addEventListener("htmx:wsOpen", function () { mark("on"); });
  document.addEventListener("htmx:wsClose", function (e) {
    mark("off");
    var closed = e.detail && e.detail.event;
    var last = Number(sessionStorage.getItem("fa-reloaded-at") || 0);
    // at most one reload a minute: a page that loads and is refused again stays as it is
    if (closed && closed.code === SESSION_ENDED && Date.now() - last > 60000) {
      sessionStorage.setItem("fa-reloaded-at", String(Date.now()));
      window.location.reload();
    }
  });
  document.addEventListener("htmx:wsError", function () { mark("off"); });
  // Here, not in an hx-trigger filter: htmx evaluates a filter as script, which the page's CSP refuses.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail && e.detail.elt;
    if (elt && elt.hasAttribute && elt.hasAttribute("data-fallback-poll") && document.body.dataset.live === "on") {
      e.preventDefault();
    }
  });
  // The pushed pod summary changed (a pod came, went or changed state): the page of the pod list
  // on screen is fetched again, so that a released pod leaves it.
  function refreshPodList() {
    var list = document.getElementById("dash-pod-list");
    if (list) { htmx.trigger(list, "refresh"); }
  }
  document.addEventListener("htmx:wsAfterMessage", function (e) {
    var message = e.detail && e.detail.message;
    if (typeof message === "string" && message.indexOf('id="dash-pods"') !== -1) { refreshPodList(); }
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail && e.detail.elt && e.detail.elt.id === "dash-poll") { refreshPodList(); }
  });
})();
