// The live parts of a page. An element with data-live names an event
// stream of this control plane: "swap" events carry server-rendered HTML
// by element id, "output" events text to append to #output, and "done"
// the final status of a job.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  if (!live) {
    return;
  }
  var state = document.getElementById("live-state");
  var say = function (text) {
    if (state) {
      state.textContent = text;
    }
  };
  var es = new EventSource(live.getAttribute("data-live"));
  es.onopen = function () {
    say("live");
  };
  es.onerror = function () {
    say(es.readyState === EventSource.CLOSED ? "disconnected: reload the page" : "reconnecting…");
  };
  es.addEventListener("swap", function (e) {
    var parts = JSON.parse(e.data);
    Object.keys(parts).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) {
        el.innerHTML = parts[id];
      }
    });
  });
  es.addEventListener("output", function (e) {
    var out = document.getElementById("output");
    if (out) {
      out.textContent += JSON.parse(e.data);
    }
  });
  es.addEventListener("done", function (e) {
    var d = JSON.parse(e.data);
    var st = document.getElementById("status");
    if (st) {
      st.textContent = d.status;
    }
    var er = document.getElementById("stderr");
    if (er && d.stderr) {
      er.textContent = d.stderr;
      er.hidden = false;
    }
    es.close();
    say("finished");
  });
})();
