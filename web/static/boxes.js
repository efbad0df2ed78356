// Rift · the Boxes page, live: one Server-Sent Events stream per open page.
// The server sends the re-rendered task list only when it changed; this swaps
// it in, keeps the relative times current and closes the stream when the page
// goes away. Same rules as web/timefmt.py.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var badge = document.getElementById("live-status");
  if (!live || !window.EventSource) { return; }

  function span(s) {
    s = Math.max(0, Math.floor(s));
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min"; }
    if (s < 86400) {
      var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
      return m ? h + " h " + m + " min" : h + " h";
    }
    var d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600);
    return hh ? d + " d " + hh + " h" : d + " d";
  }

  function relative(at, kind) {
    var delta = (Date.now() - at) / 1000;
    if (kind === "until") { return delta >= 0 ? "due now" : "in " + span(-delta); }
    if (kind === "age") { return span(delta); }
    return delta < 5 ? "just now" : span(delta) + " ago";
  }

  function refreshTimes() {
    var times = live.querySelectorAll("time[data-rel]");
    for (var i = 0; i < times.length; i++) {
      var at = Date.parse(times[i].getAttribute("datetime"));
      if (!isNaN(at)) { times[i].textContent = relative(at, times[i].getAttribute("data-rel")); }
    }
  }

  function state(name, text) {
    if (badge) { badge.setAttribute("data-state", name); badge.textContent = text; }
  }

  var stream = new EventSource("/live?v=" + encodeURIComponent(live.getAttribute("data-version")));
  stream.addEventListener("open", function () { state("live", "live"); });
  stream.addEventListener("error", function () {
    if (stream.readyState !== EventSource.CLOSED) {
      state("reconnecting", "reconnecting…");  // the browser retries by itself
      return;
    }
    // Refused (signed out, say): load the page again, which signs in if need be.
    state("reconnecting", "reloading…");
    window.setTimeout(function () { window.location.reload(); }, 3000);
  });
  stream.addEventListener("page", function (event) {
    live.innerHTML = event.data;  // server-rendered, every agent-supplied string escaped
    live.setAttribute("data-version", event.lastEventId);
    refreshTimes();
  });
  stream.addEventListener("gone", function () {
    stream.close();
    window.location.assign("/login");
  });

  window.addEventListener("pagehide", function () { stream.close(); });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted) { window.location.reload(); }  // back from the cache: stream anew
  });
  refreshTimes();
  window.setInterval(refreshTimes, 10000);
}());
