"""The board's two static assets, served by acceptrun itself: its stylesheet and its script.

The pages work without the script; it only follows live feeds (server-sent events): a
live run's step, ETA, throughput, use and cost, its three charts, and followed logs. It
never puts text from a record into markup: numbers and strings go in with
``textContent`` and SVG attributes, so a hostile name stays text.
"""

from __future__ import annotations

from acceptrun.report.html import CSS as REPORT_CSS

__all__ = ["BOARD_CSS", "LIVE_JS"]

BOARD_CSS = (
    REPORT_CSS
    + """
main{max-width:1180px}
header.top{background:#111827;color:#fff;padding:8px 24px;display:flex;gap:18px;align-items:center}
header.top a{color:#e5e7eb;text-decoration:none;font-size:14px}
header.top a.on{color:#fff;font-weight:700;border-bottom:2px solid #60a5fa}
header.top .brand{font-weight:700;color:#fff;margin-right:12px}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:8px 0}
form.filters label{font-size:12px;color:#374151;display:flex;flex-direction:column}
input,select,button{font:inherit;font-size:13px;padding:3px 6px}
button{cursor:pointer}
button.danger{background:#b91c1c;color:#fff;border:0;border-radius:4px;padding:5px 12px}
button.go{background:#1d4ed8;color:#fff;border:0;border-radius:4px;padding:5px 12px}
form.inline{display:inline}
.live-dot{display:inline-block;width:8px;height:8px;border-radius:50%;background:#16a34a;margin-right:4px}
td.verdict.accepted{color:#15803d;font-weight:600}td.verdict.rejected{color:#b91c1c;font-weight:600}
#actions{margin:8px 0}
.checks{font-size:12px;color:#7f1d1d;margin:0;padding-left:16px}
.pager a{margin:0 6px}
.flash{background:#ecfdf5;border:1px solid #a7f3d0;padding:6px 10px;border-radius:6px}
.flash.err{background:#fef2f2;border-color:#fecaca}
.kpi{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.kpi div{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:6px 12px;min-width:110px}
.kpi b{display:block;font-size:18px}
.kpi span{font-size:12px;color:#6b7280}
pre.log{max-height:640px;overflow-y:auto;white-space:pre-wrap}
svg.live path.series{fill:none;stroke-width:1.5}
"""
)

LIVE_JS = r"""
"use strict";
(function () {
  var W = 760, H = 220, L = 64, R = 16, T = 30, B = 34;
  var NS = "http://www.w3.org/2000/svg";

  function byId(id) { return document.getElementById(id); }
  function setText(id, text) { var el = byId(id); if (el) el.textContent = String(text); }
  function fmtNum(v) {
    if (typeof v !== "number" || !isFinite(v)) return "-";
    var a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toPrecision(4) + "M";
    if (a >= 1e4) return (v / 1e3).toPrecision(4) + "k";
    return a >= 1 ? v.toPrecision(4) : v.toPrecision(3);
  }
  function fmtDuration(s) {
    if (typeof s !== "number" || !isFinite(s)) return "-";
    s = Math.round(s);
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? h + "h" + String(m).padStart(2, "0") + "m" : m ? m + "m" + String(r).padStart(2, "0") + "s" : r + "s";
  }
  function fmtBytes(n) {
    if (typeof n !== "number") return "-";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + u[i];
  }

  // Min and max per pixel column: 100,000 points draw as about 1,500.
  function thin(points) {
    if (points.length <= 2 * (W - L - R)) return points;
    var x0 = points[0][0], x1 = points[points.length - 1][0], span = (x1 - x0) || 1;
    var cols = W - L - R, best = {}, keep = [];
    for (var i = 0; i < points.length; i++) {
      var c = Math.min(cols - 1, Math.floor((points[i][0] - x0) / span * cols));
      var b = best[c];
      if (!b) { best[c] = [i, i]; continue; }
      if (points[i][1] < points[b[0]][1]) b[0] = i;
      if (points[i][1] > points[b[1]][1]) b[1] = i;
    }
    for (var k in best) { keep.push(best[k][0]); if (best[k][1] !== best[k][0]) keep.push(best[k][1]); }
    keep.sort(function (a, b) { return a - b; });
    return keep.map(function (j) { return points[j]; });
  }

  function draw(svg, points) {
    var pts = thin(points);
    if (!pts.length) return;
    var xs = pts.map(function (p) { return p[0]; }), ys = pts.map(function (p) { return p[1]; });
    var xmin = Math.min.apply(null, xs), xmax = Math.max.apply(null, xs);
    var ymin = Math.min.apply(null, ys), ymax = Math.max.apply(null, ys);
    if (ymax === ymin) { ymax += Math.abs(ymax) * 0.1 || 1; ymin -= Math.abs(ymin) * 0.1 || 1; }
    var sx = (W - L - R) / ((xmax - xmin) || 1), sy = (H - T - B) / (ymax - ymin);
    var d = "", prev = null;
    for (var i = 0; i < pts.length; i++) {
      var px = L + (pts[i][0] - xmin) * sx, py = H - B - (pts[i][1] - ymin) * sy;
      var jump = prev !== null && pts[i][0] < prev;  // a restart went back in steps
      d += (d === "" || jump ? "M" : "L") + px.toFixed(1) + "," + py.toFixed(1);
      prev = pts[i][0];
    }
    svg.querySelector("path.series").setAttribute("d", d);
    svg.querySelector(".ymax").textContent = fmtNum(ymax);
    svg.querySelector(".ymin").textContent = fmtNum(ymin);
    svg.querySelector(".xmin").textContent = fmtNum(xmin);
    svg.querySelector(".xmax").textContent = fmtNum(xmax);
    svg.querySelector(".count").textContent = points.length + " steps";
  }

  function runFeed(root) {
    var series = { loss: [], throughput: [], step_time: [] };
    var maxStep = null, timer = null;
    function redraw() {
      timer = null;
      for (var k in series) { var svg = byId("live-" + k); if (svg) draw(svg, series[k]); }
    }
    var es = new EventSource(root.getAttribute("data-stream"));
    es.addEventListener("steps", function (e) {
      var rows = JSON.parse(e.data);
      for (var i = 0; i < rows.length; i++) {
        var r = rows[i];
        if (typeof r.step !== "number") continue;
        for (var k in series) {
          var v = r[k];
          if (typeof v === "number" && isFinite(v)) series[k].push([r.step, k === "step_time" ? v * 1000 : v]);
        }
        if (maxStep === null || r.step > maxStep || (r.attempt && r.attempt !== root.attempt)) maxStep = r.step;
        root.attempt = r.attempt;
      }
      if (maxStep !== null) setText("live-step", maxStep);
      if (timer === null) timer = setTimeout(redraw, 250);
    });
    es.addEventListener("status", function (e) {
      var s = JSON.parse(e.data);
      setText("live-state", s.live ? String(s.status) : "ended: " + s.status);
      if (s.total_steps !== null && s.total_steps !== undefined) setText("live-total", "of " + s.total_steps);
      setText("live-eta", fmtDuration(s.eta_s));
      setText("live-rate", s.throughput === null ? "-" : fmtNum(s.throughput) + " " + s.throughput_unit);
      var use = "-";
      if (s.gpus && s.gpus.length) {
        use = s.gpus.map(function (g) {
          return "GPU " + g.index + " " + (g.util_pct === null ? "-" : Math.round(g.util_pct) + "%") + " " + fmtBytes(g.mem_used);
        }).join(", ");
      } else if (s.proc_cpu_pct !== null && s.proc_cpu_pct !== undefined) {
        use = Math.round(s.proc_cpu_pct) + "% CPU, " + fmtBytes(s.proc_rss);
      }
      setText("live-use", use);
      setText("live-cost", s.cost_usd === null ? "not priced" : "$" + s.cost_usd.toFixed(4));
      setText("live-elapsed", fmtDuration(s.elapsed_s));
    });
    es.addEventListener("end", function (e) {
      es.close();
      var s = JSON.parse(e.data);
      setText("live-state", "ended: " + s.status + " (reload the page for the verdict)");
    });
  }

  function logFeed(pre) {
    var es = new EventSource(pre.getAttribute("data-stream"));
    es.addEventListener("line", function (e) {
      var m = JSON.parse(e.data);
      var follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode("[" + m.log + "] " + m.text + "\n"));
      if (follow) pre.scrollTop = pre.scrollHeight;
    });
    es.addEventListener("end", function (e) {
      es.close();
      setText("log-state", "the run has ended: " + JSON.parse(e.data).status);
    });
  }

  var live = byId("live");
  if (live && window.EventSource) runFeed(live);
  var log = byId("log");
  if (log && window.EventSource && log.getAttribute("data-stream")) logFeed(log);
})();
"""
