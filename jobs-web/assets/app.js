// The dashboard's one script. Pages work without it; with it, the page's <main>
// refreshes itself every few seconds (a switch pauses it), and a switch picks the theme.
(function () {
  "use strict";
  var root = document.documentElement;
  var saved = localStorage.getItem("jobs-web-theme");
  if (saved === "light" || saved === "dark") root.setAttribute("data-theme", saved);

  var themeButton = document.getElementById("theme-toggle");
  function showTheme() {
    var dark = root.getAttribute("data-theme") === "dark" ||
      (!root.getAttribute("data-theme") && window.matchMedia("(prefers-color-scheme: dark)").matches);
    themeButton.textContent = dark ? "Light theme" : "Dark theme";
    return dark;
  }
  if (themeButton) {
    themeButton.hidden = false;
    showTheme();
    themeButton.addEventListener("click", function () {
      var next = showTheme() ? "light" : "dark";
      root.setAttribute("data-theme", next);
      localStorage.setItem("jobs-web-theme", next);
      showTheme();
    });
  }

  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  var liveButton = document.getElementById("live-toggle");
  var main = document.getElementById("live");
  // Only pages that show (not forms that ask or answer) refresh.
  var refreshable = seconds > 0 && main && !document.querySelector("main input[name=confirmed], #outcome, form.login");
  if (!refreshable || !liveButton) return;
  var paused = localStorage.getItem("jobs-web-paused") === "1";
  function showLive() { liveButton.textContent = paused ? "Resume refresh" : "Pause refresh"; }
  liveButton.hidden = false;
  showLive();
  liveButton.addEventListener("click", function () {
    paused = !paused;
    localStorage.setItem("jobs-web-paused", paused ? "1" : "0");
    showLive();
  });
  function busy() {
    // Never replace what the reader is typing in or has selected.
    var active = document.activeElement;
    if (active && main.contains(active) && (active.tagName === "INPUT" || active.tagName === "SELECT")) return true;
    var selection = window.getSelection();
    return selection && !selection.isCollapsed;
  }
  function refresh() {
    if (paused || document.hidden || busy()) return;
    fetch(window.location.href, { headers: { "X-Requested-With": "refresh" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (fresh && !busy()) main.replaceChildren.apply(main, Array.from(fresh.childNodes));
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {});
  }
  setInterval(refresh, seconds * 1000);
})();
