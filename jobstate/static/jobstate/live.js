/* jobstate admin: live refresh of the job list, the job page and the dashboard.
 *
 * No framework, no CDN. The page's <script id="js-live"> carries data attributes:
 *   data-url    the admin's JSON endpoint (<admin>/jobstate/job/live/)
 *   data-mode   "list", "job" or "dashboard"
 *   data-job    (job page) the job's id;   data-status  its status when rendered
 *   data-active (dashboard) how many jobs were active when rendered
 *   data-every  poll interval in ms (default 1000)
 * It polls while anything shown is active and stops when nothing is
 * (data-state on the script element: "polling" or "stopped"). Status and progress
 * cells are replaced with server-rendered HTML; on the job page a status change
 * re-reads the page's main content (history, buttons) without a reload.
 */
(function () {
  "use strict";
  var root = document.getElementById("js-live");
  if (!root || !window.fetch) { return; }
  var url = root.getAttribute("data-url");
  var mode = root.getAttribute("data-mode");
  var every = parseInt(root.getAttribute("data-every") || "1000", 10);
  var failures = 0;

  function setState(state) { root.setAttribute("data-state", state); }

  function listRows() {
    return Array.prototype.slice.call(document.querySelectorAll("#result_list [data-job]"));
  }

  function shownIds() {
    if (mode === "job") { return [root.getAttribute("data-job")]; }
    if (mode === "list") {
      return listRows().filter(function (el) { return el.getAttribute("data-active") === "1"; })
        .map(function (el) { return el.getAttribute("data-job"); });
    }
    return [];
  }

  function anythingActive() {
    if (mode === "job") { return root.getAttribute("data-active") === "1"; }
    if (mode === "list") { return shownIds().length > 0; }
    return parseInt(root.getAttribute("data-active") || "0", 10) > 0;
  }

  // Only for the endpoint's cells, fields and panels: HTML the server escaped
  // (live.py's html()). Plain values (counts) are set as text.
  function setHtml(el, html) {
    if (el && html !== undefined && el.innerHTML !== html) { el.innerHTML = html; }
  }

  function applyList(jobs) {
    listRows().forEach(function (el) {
      var job = jobs[el.getAttribute("data-job")];
      if (!job) { return; }
      var row = el.closest("tr");
      Object.keys(job.cells).forEach(function (name) {
        setHtml(row.querySelector("td.field-" + name + ", th.field-" + name), job.cells[name]);
      });
      el.setAttribute("data-active", job.active ? "1" : "0");
    });
  }

  function reloadContent() {
    // The status changed: the history, the buttons and the sections follow it.
    return fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) { return; }
        var doc = new DOMParser().parseFromString(text, "text/html");
        var fresh = doc.getElementById("content-main");
        var current = document.getElementById("content-main");
        if (fresh && current) { current.innerHTML = fresh.innerHTML; }
      });
  }

  function fieldValue(name) {
    // A field sharing a line with others sits in its own .fieldBox; the line
    // (.form-row) carries every field's class, so the box is looked for first.
    var box = document.querySelector(".fieldBox.field-" + name) ||
      document.querySelector(".form-row.field-" + name);
    return box ? box.querySelector(".readonly") : null;
  }

  function applyJob(jobs) {
    var job = jobs[root.getAttribute("data-job")];
    if (!job) { root.setAttribute("data-active", "0"); return null; }
    Object.keys(job.fields).forEach(function (name) { setHtml(fieldValue(name), job.fields[name]); });
    var changed = job.status !== root.getAttribute("data-status") ||
      String(job.attempts) !== root.getAttribute("data-attempts");
    root.setAttribute("data-status", job.status);
    root.setAttribute("data-attempts", String(job.attempts));
    root.setAttribute("data-active", job.active ? "1" : "0");
    return changed ? reloadContent() : null;
  }

  // A count as the page writes it (the template filter "number"): 3,006.
  function count(n) {
    return typeof n === "number" ? n.toLocaleString("en-US") : String(n);
  }

  function applyDashboard(data) {
    var board = data.dashboard;
    if (!board) { return; }
    Object.keys(board.counts).forEach(function (name) {
      document.querySelectorAll("[data-live-count='" + name + "']").forEach(function (el) {
        el.textContent = count(board.counts[name]);
      });
    });
    Object.keys(board.html).forEach(function (id) { setHtml(document.getElementById(id), board.html[id]); });
    root.setAttribute("data-active", String(board.active));
  }

  function tick() {
    if (!anythingActive()) { setState("stopped"); return; }
    if (document.visibilityState === "hidden") { window.setTimeout(tick, every); return; }
    var query = "mode=" + encodeURIComponent(mode) + "&ids=" + encodeURIComponent(shownIds().join(","));
    if (mode === "dashboard") { query += "&dashboard=1"; }
    fetch(url + "?" + query, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (r.status === 403 || r.status === 404 || r.redirected) { throw new Error("stop"); }
        if (!r.ok) { throw new Error("http " + r.status); }
        return r.json();
      })
      .then(function (data) {
        failures = 0;
        var pending = null;
        if (mode === "list") { applyList(data.jobs); }
        else if (mode === "job") { pending = applyJob(data.jobs); }
        else { applyDashboard(data); }
        return pending;
      })
      .then(function () { window.setTimeout(tick, every); },
        function (err) {
          failures += 1;
          if (err.message === "stop" || failures > 5) { setState("stopped"); return; }
          window.setTimeout(tick, every * (1 + failures));
        });
  }

  if (anythingActive()) { setState("polling"); window.setTimeout(tick, every); }
  else { setState("stopped"); }
})();
