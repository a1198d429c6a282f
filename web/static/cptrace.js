// Draws every chart of a page from the JSON block next to it, and wires the filter forms.
// Figures arrive as <script type="application/json"> (escaped by the server), never as inline JS.
"use strict";
(function () {
  // A figure may send each distinct string once (web/figures.py, expand_figure): "strings"
  // holds them, and each trace's "indexed" names its fields that hold indexes into it; a
  // trace's "copies" maps a field to the field of the same trace it repeats. Put them back
  // before plotly sees the figure.
  function expandFigure(fig) {
    var strings = fig.strings;
    if (!strings) return fig;
    fig.data.forEach(function (trace) {
      (trace.indexed || []).forEach(function (field) {
        trace[field] = trace[field].map(function (i) {
          return strings[i];
        });
      });
      Object.keys(trace.copies || {}).forEach(function (field) {
        trace[field] = trace[trace.copies[field]].slice();
      });
      delete trace.indexed;
      delete trace.copies;
    });
    delete fig.strings;
    return fig;
  }

  function drawCharts() {
    var charts = document.querySelectorAll(".chart[data-figure]");
    if (!charts.length) {
      document.body.dataset.chartsReady = "true";
      return;
    }
    if (typeof Plotly === "undefined") {
      console.error("cptrace: plotly.js did not load; charts cannot be drawn");
      return;
    }
    var drawn = [];
    charts.forEach(function (el) {
      var source = document.getElementById(el.dataset.figure);
      if (!source) return;
      var fig = expandFigure(JSON.parse(source.textContent));
      drawn.push(
        Plotly.newPlot(el, fig.data, fig.layout, { responsive: true, displaylogo: false }).then(
          function () {
            el.on("plotly_click", function (event) {
              var link = event.points && event.points[0] && event.points[0].customdata;
              // only site-relative links: customdata comes from the server, but stay strict
              if (typeof link === "string" && link.charAt(0) === "/" && link.charAt(1) !== "/") {
                window.location.href = link;
              }
            });
          }
        )
      );
    });
    Promise.all(drawn).then(function () {
      zoomFromHash();
      document.body.dataset.chartsReady = "true";
    });
  }

  // Idle-cause links point at "#timeline_N@X0-X1" (a timeline chart, ms from its window's
  // start): scroll to that chart and zoom its x axis there, on click, on load and when the
  // fragment changes.
  function zoomTimeline(name, x0, x1) {
    var el = document.getElementById("chart-" + name);
    if (!el || typeof Plotly === "undefined" || !(x1 > x0)) return;
    Plotly.relayout(el, { "xaxis.range": [x0, x1] }).then(function () {
      el.dataset.zoom = x0 + "-" + x1;
    });
    var holder = document.getElementById(name + "-view");
    if (holder && holder.scrollIntoView) holder.scrollIntoView();
  }

  function zoomFromHash() {
    var match = /^#(timeline(?:_[0-9]+)?)@([0-9.]+)-([0-9.]+)$/.exec(window.location.hash);
    if (match) zoomTimeline(match[1], parseFloat(match[2]), parseFloat(match[3]));
  }

  function timelineLinks() {
    document.querySelectorAll("a.timeline-zoom").forEach(function (link) {
      link.addEventListener("click", function () {
        var name = (link.dataset.chart || "").replace(/^chart-/, "");
        zoomTimeline(name, parseFloat(link.dataset.x0), parseFloat(link.dataset.x1));
      });
    });
    window.addEventListener("hashchange", zoomFromHash);
  }

  function autosubmit() {
    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      select.addEventListener("change", function () {
        select.form.submit();
      });
    });
  }

  // Tables marked "sortable": a click on a header with data-sort="num"|"text" sorts the body
  // by that column (numbers from the cell's data-value, the exact figure), again to reverse.
  function sortableTables() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var headers = table.querySelectorAll("thead th");
      headers.forEach(function (th, column) {
        var kind = th.dataset.sort;
        if (!kind) return;
        th.classList.add("sortable-column");
        th.addEventListener("click", function () {
          var descending = th.dataset.order !== "desc";
          headers.forEach(function (other) {
            delete other.dataset.order;
          });
          th.dataset.order = descending ? "desc" : "asc";
          var body = table.tBodies[0];
          var rows = Array.prototype.slice.call(body.rows);
          rows.sort(function (a, b) {
            var x = a.cells[column], y = b.cells[column];
            if (!x || !y) return 0;
            var order;
            if (kind === "num") {
              order = parseFloat(x.dataset.value || x.textContent) -
                parseFloat(y.dataset.value || y.textContent);
            } else {
              order = x.textContent.localeCompare(y.textContent);
            }
            return descending ? -order : order;
          });
          rows.forEach(function (row) {
            body.appendChild(row);
          });
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    autosubmit();
    sortableTables();
    timelineLinks();
    drawCharts();
  });
})();
