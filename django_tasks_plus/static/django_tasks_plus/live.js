/* Live admin pages (docs/admin.md, "Live pages"): poll the page's JSON view and replace
 * its marked regions in place. No dependencies and no inline script (a strict
 * Content-Security-Policy allows it): the page describes itself in data attributes on
 * its ".dtp-live" bar (admin/django_tasks_plus/live/bar.html).
 *
 * The JSON is {"regions": {"<element id>": "<html>"}, "interval": <seconds>}; only
 * elements marked data-dtp-live-region are replaced. Polling pauses with the button (the
 * choice is kept in localStorage, for every live page), while the tab is hidden, and
 * after repeated failures (then the bar says why and offers a retry). A region holding
 * the field the user is typing in, or text they selected, is left for a later round;
 * open tracebacks stay open, focus and the scroll position stay where they were.
 */
(function () {
  "use strict";

  var PAUSED_KEY = "dtp-live-paused";
  var MAX_FAILURES = 3;
  var FOCUSABLE = "a[href], button, summary, input, select, textarea";

  function format(template, values) {
    return template.replace(/%\((\w+)\)s/g, function (_match, name) {
      return values[name];
    });
  }

  function storedPause() {
    try {
      return window.localStorage.getItem(PAUSED_KEY) === "1";
    } catch (e) {
      return false; // storage blocked: live, and the button still pauses this page
    }
  }

  function storePause(paused) {
    try {
      if (paused) {
        window.localStorage.setItem(PAUSED_KEY, "1");
      } else {
        window.localStorage.removeItem(PAUSED_KEY);
      }
    } catch (e) {
      /* not kept across pages; this page still obeys */
    }
  }

  function Failure(message, fatal) {
    this.message = message;
    this.fatal = fatal;
  }

  // Where focus is inside a region, as its index among the region's focusable elements.
  function focusIndex(region) {
    var active = document.activeElement;
    if (!active || !region.contains(active)) {
      return -1;
    }
    return Array.prototype.indexOf.call(region.querySelectorAll(FOCUSABLE), active);
  }

  // The user types in a field of the region, or has selected some of its text (to copy
  // an id, say): leave it for a later round.
  function inUse(region) {
    var active = document.activeElement;
    if (active && region.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    var selection = window.getSelection();
    return !!selection && !selection.isCollapsed && region.contains(selection.anchorNode);
  }

  function replace(region, html) {
    var open = [];
    region.querySelectorAll("details").forEach(function (details, index) {
      if (details.open) {
        open.push(index);
      }
    });
    var focused = focusIndex(region);
    region.innerHTML = html;
    var details = region.querySelectorAll("details");
    open.forEach(function (index) {
      if (details[index]) {
        details[index].open = true;
      }
    });
    if (focused >= 0) {
      var again = region.querySelectorAll(FOCUSABLE)[focused];
      if (again) {
        again.focus({preventScroll: true});
      }
    }
  }

  function start(bar) {
    var url = bar.getAttribute("data-dtp-live-url");
    var interval = 1000 * (Number(bar.getAttribute("data-dtp-live-interval")) || 5);
    var label = function (name) {
      return bar.getAttribute("data-label-" + name) || name;
    };
    var toggle = bar.querySelector(".dtp-live-toggle");
    var toggleLabel = bar.querySelector(".dtp-live-label");
    var status = bar.querySelector(".dtp-live-status");
    var alert = bar.querySelector(".dtp-live-alert"); // role=alert: only a stop is announced
    var retry = bar.querySelector(".dtp-live-retry");
    var paused = storedPause();
    var timer = null;
    var request = null;
    var failures = 0;
    var stopped = null; // why polling stopped, until the user retries
    var applied = {}; // region id -> the html last put there

    function polling() {
      return !paused && stopped === null && document.visibilityState === "visible";
    }

    function show(text) {
      bar.classList.toggle("dtp-live-paused", paused);
      bar.classList.toggle("dtp-live-stopped", stopped !== null);
      toggle.setAttribute("aria-pressed", paused ? "false" : "true");
      toggleLabel.textContent = paused ? label("paused") : label("live");
      retry.hidden = stopped === null;
      alert.textContent = stopped === null ? "" : format(label("stopped"), {reason: stopped});
      if (stopped !== null) {
        status.textContent = "";
      } else if (paused) {
        status.textContent = "";
      } else if (document.visibilityState !== "visible") {
        status.textContent = label("hidden");
      } else if (text !== undefined) {
        status.textContent = text;
      }
    }

    function halt() {
      window.clearTimeout(timer);
      timer = null;
      if (request) {
        request.abort();
        request = null;
      }
    }

    function schedule(delay) {
      halt();
      if (polling()) {
        timer = window.setTimeout(poll, delay);
      }
    }

    function apply(regions) {
      var x = window.scrollX;
      var y = window.scrollY;
      Object.keys(regions).forEach(function (id) {
        var region = document.getElementById(id);
        var html = regions[id];
        if (!region || !region.hasAttribute("data-dtp-live-region") || applied[id] === html) {
          return;
        }
        if (inUse(region)) {
          return; // never under the user's cursor: a later round will do
        }
        replace(region, html);
        applied[id] = html;
      });
      if (window.scrollX !== x || window.scrollY !== y) {
        window.scrollTo(x, y);
      }
    }

    function poll() {
      timer = null;
      var controller = new AbortController();
      request = controller;
      fetch(url, {
        credentials: "same-origin",
        headers: {Accept: "application/json"},
        cache: "no-store",
        redirect: "manual", // the admin sends a lost session to its login page
        signal: controller.signal,
      })
        .then(function (response) {
          if (response.type === "opaqueredirect") {
            throw new Failure(label("login"), true);
          }
          return response.json().then(
            function (body) {
              if (!response.ok) {
                // 400 (a filter the list cannot apply), 403, 404: asking again won't help.
                var fatal = response.status >= 400 && response.status < 500;
                throw new Failure((body && body.error) || "HTTP " + response.status, fatal);
              }
              if (!body || typeof body.regions !== "object") {
                throw new Failure("HTTP " + response.status, false);
              }
              return body;
            },
            function () {
              throw new Failure("HTTP " + response.status, response.status === 403);
            }
          );
        })
        .then(function (body) {
          request = null;
          failures = 0;
          apply(body.regions);
          if (Number(body.interval) > 0) {
            interval = 1000 * Number(body.interval);
          }
          show(format(label("updated"), {time: new Date().toLocaleTimeString()}));
          schedule(interval);
        })
        .catch(function (error) {
          if (controller.signal.aborted) {
            return; // paused or hidden meanwhile
          }
          request = null;
          failures += 1;
          var reason = error instanceof Failure ? error.message : String(error.message || error);
          if ((error instanceof Failure && error.fatal) || failures >= MAX_FAILURES) {
            stopped = reason;
            show();
          } else {
            show(format(label("retrying"), {reason: reason}));
            schedule(interval);
          }
        });
    }

    toggle.addEventListener("click", function () {
      paused = !paused;
      storePause(paused);
      if (!paused) {
        stopped = null;
        failures = 0;
      }
      show("");
      schedule(0);
    });
    retry.addEventListener("click", function () {
      stopped = null;
      failures = 0;
      show("");
      schedule(0);
      toggle.focus();
    });
    document.addEventListener("visibilitychange", function () {
      show();
      schedule(0); // visible again: refresh now; hidden: stop
    });
    window.addEventListener("storage", function (event) {
      if (event.key === PAUSED_KEY && storedPause() !== paused) {
        paused = storedPause(); // paused or resumed in another tab
        show("");
        schedule(0);
      }
    });

    bar.hidden = false;
    show(format(label("updated"), {time: new Date().toLocaleTimeString()})); // drawn just now
    schedule(interval);
  }

  function init() {
    document.querySelectorAll(".dtp-live[data-dtp-live-url]").forEach(start);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
