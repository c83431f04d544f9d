/* Benchmark charts: uPlot lines over "seconds since the run started" (console.js's npuChart
   draws wall-clock time axes). Markup: <div class="chart bench-chart" data-bench='{"x":[0,1,..],
   "series":[{"label":"tokens/s","values":[..]}],"yLabel":"tok/s"}'>. Redrawn after htmx swaps
   (the live run page) and theme changes. */
(function () {
  'use strict';
  var charts = new Map(); // element -> {u, src}
  var DASH = [undefined, [6, 3], [2, 3], [10, 3, 2, 3]];
  function cssVar(el, name) { return getComputedStyle(el).getPropertyValue(name).trim(); }
  function draw(el) {
    var old = charts.get(el), src = el.dataset.bench || '', spec;
    if (old) { old.u.destroy(); charts.delete(el); }
    if (!window.uPlot) return;
    try { spec = JSON.parse(src); } catch (e) { spec = null; }
    el.textContent = '';
    if (!spec || !spec.x || !spec.x.length) {
      var p = document.createElement('p'); p.className = 'empty small'; p.textContent = el.dataset.empty || 'No data yet';
      el.appendChild(p); return;
    }
    var muted = cssVar(el, '--text-muted'), grid = cssVar(el, '--chart-grid'), font = '11px ' + cssVar(el, '--font-sans'), unit = spec.yLabel || '';
    var axis = function (extra) {
      return Object.assign({ stroke: muted, font: font, labelFont: font, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } }, extra);
    };
    var legendH = 28, w = el.clientWidth || 300, h = (el.clientHeight || 200) - legendH;
    var u = new window.uPlot({
      width: w, height: Math.max(80, h),
      scales: { x: { time: false, range: function (u, lo, hi) { return [0, Math.max(hi, spec.xMax || 0)]; } } },
      axes: [axis({ label: spec.xLabel || 's since start', labelSize: 16, size: 36 }), axis({ label: unit, labelSize: unit ? 16 : 0, size: 50 })],
      series: [{ label: 's', value: function (u, v) { return v == null ? '–' : v + ' s'; } }].concat(spec.series.map(function (s, i) {
        return {
          label: s.label, width: 1.5, dash: DASH[i % DASH.length], points: { show: spec.x.length < 40, size: 4 },
          stroke: cssVar(el, '--series-' + (i % 6 + 1)), spanGaps: false,
          value: function (u, v) { return v == null ? '–' : +v.toFixed(2) + (unit ? ' ' + unit : ''); }
        };
      }))
    }, [spec.x].concat(spec.series.map(function (s) { return s.values; })), el);
    charts.set(el, { u: u, src: src });
  }
  function refresh() {
    charts.forEach(function (c, el) { if (!el.isConnected) { c.u.destroy(); charts.delete(el); } });
    document.querySelectorAll('.bench-chart[data-bench]').forEach(function (el) {
      var c = charts.get(el); if (!c || c.src !== el.dataset.bench) draw(el);
    });
  }
  function redrawAll() { Array.from(charts.keys()).forEach(draw); }
  document.addEventListener('htmx:afterSettle', refresh);
  document.addEventListener('click', function (e) { if (e.target.closest('[data-theme-toggle]')) requestAnimationFrame(redrawAll); });
  window.addEventListener('resize', function () { clearTimeout(window.__benchResize); window.__benchResize = setTimeout(redrawAll, 150); });
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', refresh); else refresh();
})();
