// What every page needs of script, kept out of the templates: the Content-Security-Policy
// (fleetadmin/settings.py) runs no inline script, no on*= handler and no style="" attribute.
// - A form with data-confirm asks before it is sent.
// - A form posted without a CSRF field (pushed over a websocket, rendered without a request:
//   ocrjobs/live.py) gets the page's token, the one htmx sends (<body hx-headers>).
// - An element with data-width (a percent) or data-aspect ("width / height") gets that size, in
//   the first render and in every part htmx swaps in later (a poll, a websocket push).
// - The job form's submit waits while its forecast shows an error (the submit would be refused
//   for it, and says why); any change to the form lets it be sent again.
(function () {
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
      return;
    }
    if (form.method === "post" && !form.querySelector("input[name=csrfmiddlewaretoken]")) {
      var headers = JSON.parse(document.body.getAttribute("hx-headers") || "{}");
      var field = document.createElement("input");
      field.type = "hidden";
      field.name = "csrfmiddlewaretoken";
      field.value = headers["X-CSRFToken"] || "";
      form.append(field);
    }
  });

  function size(root) {
    if (!root.querySelectorAll) return;
    var elements = Array.prototype.slice.call(root.querySelectorAll("[data-width], [data-aspect]"));
    if (root.matches && root.matches("[data-width], [data-aspect]")) elements.push(root);
    elements.forEach(function (element) {
      var width = Number(element.dataset.width);
      if (element.dataset.width !== undefined && Number.isFinite(width)) element.style.width = width + "%";
      if (element.dataset.aspect) element.style.aspectRatio = element.dataset.aspect;
    });
  }

  // Nodes added by a swap are sized before the browser paints them (a mutation observer's
  // callback runs before the next frame).
  new MutationObserver(function (mutations) {
    mutations.forEach(function (mutation) {
      mutation.addedNodes.forEach(size);
      if (mutation.type === "attributes") size(mutation.target);
    });
  }).observe(document.documentElement, {
    childList: true, subtree: true, attributes: true, attributeFilter: ["data-width", "data-aspect"],
  });
  size(document);

  function submitFollowsForecast() {
    var forecast = document.getElementById("forecast");
    var form = forecast && forecast.closest("form");
    var submit = form && form.querySelector("button[type=submit]");
    if (!submit) return;
    var error = forecast.querySelector(".error");
    submit.disabled = Boolean(error);
    if (error) {
      error.id = "forecast-error";
      submit.setAttribute("aria-describedby", "forecast-error");
    } else {
      submit.removeAttribute("aria-describedby");
    }
  }
  document.addEventListener("htmx:afterSettle", submitFollowsForecast);
  ["input", "change"].forEach(function (kind) {
    document.addEventListener(kind, function (event) {
      var form = event.target.form;
      var submit = form && form.querySelector("#forecast") && form.querySelector("button[type=submit]");
      if (!submit) return;
      submit.disabled = false;
      submit.removeAttribute("aria-describedby");
    });
  });
  submitFollowsForecast();
})();
