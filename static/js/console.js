/* NPU Console behaviours: vanilla JS, no build step, works with htmx 2.
   Load in <head> WITHOUT defer (so the saved theme applies before first paint);
   everything touching the page waits for DOMContentLoaded. See docs/design.md. */
(function () {
  'use strict';
  var root = document.documentElement, THEME_KEY = 'npu-theme';
  var $$ = function (sel, scope) { return Array.prototype.slice.call((scope || document).querySelectorAll(sel)); };
  /* (e) theme: saved choice wins over the system preference */
  try { var saved = localStorage.getItem(THEME_KEY); if (saved === 'dark' || saved === 'light') root.dataset.theme = saved; } catch (e) { /* storage off */ }
  var darkQuery = window.matchMedia ? matchMedia('(prefers-color-scheme: dark)') : null;
  function theme() { return root.dataset.theme || (darkQuery && darkQuery.matches ? 'dark' : 'light'); }
  function syncToggles() { $$('[data-theme-toggle]').forEach(function (b) { b.setAttribute('aria-pressed', String(theme() === 'dark')); }); }
  function toggleTheme() {
    var t = root.dataset.theme = theme() === 'dark' ? 'light' : 'dark';
    try { localStorage.setItem(THEME_KEY, t); } catch (e) { /* storage off */ }
    syncToggles(); redrawCharts();
  }
  /* (a) relative times: <time datetime="ISO"> -> "3 min ago", title = absolute local time */
  function ago(ms) {
    var a = Math.abs(Math.round(ms / 1000)), t;
    if (a < 5) return 'just now';
    if (a < 60) t = a + ' s'; else if (a < 3600) t = Math.floor(a / 60) + ' min';
    else if (a < 86400) t = Math.floor(a / 3600) + ' h'; else t = Math.floor(a / 86400) + ' d';
    return ms < 0 ? 'in ' + t : t + ' ago';
  }
  function updateTimes() {
    $$('time[datetime]').forEach(function (el) {
      if (el.dataset.relative === 'off') return;
      var d = new Date(el.getAttribute('datetime'));
      if (!isNaN(d.getTime())) { el.textContent = ago(Date.now() - d.getTime()); el.title = d.toLocaleString(); }
    });
  }
  /* (b) pause `every` polling while the tab is hidden, and while a pause button naming the poll
     is pressed (<button data-poll-pause="#poll-id" aria-pressed="false">Pause</button>: a click
     toggles it); fire `visible` on body when the tab comes back. Not hx-trigger filters: htmx
     runs those with Function(), which the Content-Security-Policy forbids. */
  function pausedByButton(elt) {
    return $$('[data-poll-pause][aria-pressed="true"]').some(function (b) {
      try { return elt.matches(b.getAttribute('data-poll-pause')); } catch (e) { return false; }
    });
  }
  document.addEventListener('htmx:beforeRequest', function (evt) {
    var d = evt.detail || {}, elt = d.elt, cfg = d.requestConfig || {};
    var trig = elt && elt.getAttribute ? (elt.getAttribute('hx-trigger') || elt.getAttribute('data-hx-trigger') || '') : '';
    if (cfg.triggeringEvent || !/(^|,)\s*every\s/.test(trig)) return; // polls carry no DOM event
    if (document.visibilityState === 'hidden' || pausedByButton(elt)) evt.preventDefault();
  });
  document.addEventListener('click', function (e) {
    var b = e.target.closest && e.target.closest('[data-poll-pause]');
    if (!b) return;
    var on = b.getAttribute('aria-pressed') !== 'true';
    b.setAttribute('aria-pressed', String(on));
    b.textContent = on ? 'Resume' : 'Pause';
  });
  /* (k) <form data-confirm="Question?"> asks before it is submitted; a "no" stops the submit
     before anything else (htmx included) sees it. (l) <select data-autosubmit> submits its
     form when changed. No onsubmit=/onchange= attributes: the CSP forbids inline handlers. */
  document.addEventListener('submit', function (e) {
    var form = e.target.closest && e.target.closest('form[data-confirm]');
    if (form && !window.confirm(form.getAttribute('data-confirm'))) { e.preventDefault(); e.stopPropagation(); }
  }, true);
  document.addEventListener('change', function (e) {
    var t = e.target;
    if (!t.matches || !t.matches('[data-autosubmit]') || !t.form) return;
    if (t.form.requestSubmit) t.form.requestSubmit(); else t.form.submit();
  });
  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState !== 'visible' || !document.body) return;
    updateTimes(); document.body.dispatchEvent(new CustomEvent('visible', { bubbles: true }));
  });
  /* (c) sortable tables: table.table[data-sortable]; th[data-nosort] opts out */
  var sortState = {}; // table id -> {idx, dir}, re-applied when htmx swaps in a fresh table
  var NUM = /^[-+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?\s*(%|[a-z/]{1,8})?$/i;
  function toNum(s) { return NUM.test(s) ? parseFloat(s.replace(/,/g, '')) : NaN; }
  function cellKey(td) {
    if (!td) return '';
    if (td.hasAttribute('data-value')) return td.getAttribute('data-value').trim();
    var t = td.querySelector('time[datetime]');
    if (t && !isNaN(Date.parse(t.getAttribute('datetime')))) return String(Date.parse(t.getAttribute('datetime')));
    return td.textContent.trim();
  }
  function sortTable(table, idx, dir) {
    var body = table.tBodies[0], head = table.tHead;
    if (!body || !head) return;
    var rows = $$(':scope > tr', body).map(function (r, i) { return { r: r, k: cellKey(r.cells[idx]), i: i }; });
    var numeric = rows.some(function (x) { return x.k !== ''; }) && rows.every(function (x) { return x.k === '' || !isNaN(toNum(x.k)); });
    var m = dir === 'descending' ? -1 : 1;
    rows.sort(function (a, b) {
      if ((a.k === '') !== (b.k === '')) return a.k === '' ? 1 : -1; // blanks last
      var c = numeric ? toNum(a.k) - toNum(b.k) : a.k.localeCompare(b.k, undefined, { numeric: true, sensitivity: 'base' });
      return c * m || a.i - b.i;
    });
    var frag = document.createDocumentFragment();
    rows.forEach(function (x) { frag.appendChild(x.r); }); body.appendChild(frag);
    $$('th[aria-sort]', head).forEach(function (th) { th.setAttribute('aria-sort', th.cellIndex === idx ? dir : 'none'); });
    if (table.id) sortState[table.id] = { idx: idx, dir: dir };
  }
  function clickSort(th) {
    sortTable(th.closest('table'), th.cellIndex, th.getAttribute('aria-sort') === 'ascending' ? 'descending' : 'ascending');
  }
  function initTables() {
    $$('table.table[data-sortable]').forEach(function (table) {
      if (table.dataset.sortReady) return; else table.dataset.sortReady = '1';
      $$('thead th:not([data-nosort])', table).forEach(function (th) {
        if (!th.hasAttribute('aria-sort')) th.setAttribute('aria-sort', 'none');
        th.tabIndex = 0;
      });
      var s = table.id && sortState[table.id];
      if (s) sortTable(table, s.idx, s.dir);
    });
  }
  /* (d) text filter: <input data-filter-table="#id"> hides non-matching body rows */
  function applyFilter(input) {
    var table = document.querySelector(input.getAttribute('data-filter-table')), q;
    if (!table) return;
    q = input.value.trim().toLowerCase();
    Array.prototype.forEach.call(table.tBodies, function (b) {
      $$(':scope > tr', b).forEach(function (r) { r.hidden = !!q && r.textContent.toLowerCase().indexOf(q) === -1; });
    });
  }
  document.addEventListener('input', function (e) { if (e.target.matches('[data-filter-table]')) applyFilter(e.target); });
  /* clicks: theme toggle, sortable headers */
  document.addEventListener('click', function (e) {
    $$('details.menu[open]').forEach(function (m) { if (!m.contains(e.target)) m.open = false; });
    if (e.target.closest('[data-theme-toggle]')) return toggleTheme();
    var th = e.target.closest('table.table[data-sortable] th[aria-sort]');
    if (th) clickSort(th);
  });
  /* (f) keyboard shortcuts: g d, g n (or any a[data-shortcut="g x"]), / and ? */
  var pendingG = 0, GO = { d: '/', n: '/nodes/' };
  function toggleShortcuts(force) {
    var el = document.getElementById('shortcuts'), open, want;
    if (!el) return;
    open = el.tagName === 'DIALOG' ? el.open : !el.hidden;
    want = force === undefined ? !open : force;
    if (want === open) return;
    if (el.tagName === 'DIALOG') { if (want) el.showModal(); else el.close(); } else el.hidden = !want;
  }
  document.addEventListener('keydown', function (e) {
    var t = e.target;
    if (e.key === 'Enter' || e.key === ' ') {
      if (t.matches && t.matches('table.table[data-sortable] th[aria-sort]')) { e.preventDefault(); clickSort(t); }
      return;
    }
    if (e.key === 'Escape' && t.matches && t.matches('[data-filter-table]')) { t.value = ''; applyFilter(t); t.blur(); return; }
    if (e.key === 'Escape') $$('details.menu[open]').forEach(function (m) { m.open = false; });
    if (e.ctrlKey || e.metaKey || e.altKey || e.defaultPrevented || e.isComposing) return;
    if (t.isContentEditable || (t.closest && t.closest('input, textarea, select'))) return;
    if (pendingG && Date.now() - pendingG < 1500) {
      pendingG = 0;
      var link = document.querySelector('a[data-shortcut="g ' + e.key + '"]'), dest = link ? link.href : GO[e.key];
      if (dest) { e.preventDefault(); location.href = dest; }
      return;
    }
    pendingG = 0;
    if (e.key === 'g') pendingG = Date.now();
    else if (e.key === '/') {
      var f = document.querySelector('[data-filter-table]');
      if (f) { e.preventDefault(); f.focus(); if (f.select) f.select(); }
    } else if (e.key === '?') { e.preventDefault(); toggleShortcuts(); }
    else if (e.key === 'Escape') toggleShortcuts(false);
  });
  /* (i) copy buttons: <button data-copy="#id"> copies that element's text (the clipboard API;
     on a plain-http console, where it is missing, the text is selected for Ctrl+C instead) */
  function copied(btn, text) { var was = btn.textContent; btn.textContent = text; setTimeout(function () { btn.textContent = was; }, 2000); }
  function selectText(el) { var r = document.createRange(), s = window.getSelection(); r.selectNodeContents(el); s.removeAllRanges(); s.addRange(r); }
  document.addEventListener('click', function (e) {
    var btn = e.target.closest('[data-copy]'), src = btn && document.querySelector(btn.getAttribute('data-copy'));
    if (!src) return;
    var text = src.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(btn, 'Copied'); },
        function () { selectText(src); copied(btn, 'Press Ctrl+C'); });
    } else { selectText(src); copied(btn, 'Press Ctrl+C'); }
  });
  /* (j) <details data-keep-open id=...> inside a live region: what the user opened or closed
     stays so when the region is swapped in again (the server renders its default) */
  var keptOpen = {};
  document.addEventListener('click', function (e) {
    var sum = e.target.closest('details[data-keep-open][id] > summary');
    if (sum) keptOpen[sum.parentElement.id] = !sum.parentElement.open; // the click toggles it next
  });
  ['htmx:afterSwap', 'htmx:load'].forEach(function (n) { document.addEventListener(n, function () {
    Object.keys(keptOpen).forEach(function (id) { var d = document.getElementById(id); if (d) d.open = keptOpen[id]; });
  }); });
  /* (h) failed htmx requests (live refresh, actions): one banner saying what failed and that the
     page keeps trying; it goes away on the next request that succeeds */
  function connStatus(text) {
    var el = document.getElementById('conn-status'), main = document.getElementById('main');
    if (!el && !text) return;
    if (!el) {
      if (!main) return;
      el = document.createElement('div');
      el.id = 'conn-status';
      el.className = 'alert alert--error conn-status';
      el.setAttribute('role', 'alert');
      el.dataset.testid = 'conn-status';
      main.insertBefore(el, main.firstChild);
    }
    if (text) { el.textContent = text; } else { el.remove(); }
  }
  document.addEventListener('htmx:sendError', function () {
    connStatus('Cannot reach the console: the page shows the last data it received and keeps trying.');
  });
  document.addEventListener('htmx:responseError', function (e) {
    var x = e.detail.xhr, why = x.status === 403 ? 'you are not allowed to do this' :
      x.status === 401 || x.status === 302 ? 'your session ended: sign in again' :
      x.status >= 500 ? 'the console had an error (HTTP ' + x.status + ')' : 'HTTP ' + x.status;
    connStatus('Request failed: ' + why + '. The page shows the last data it received.');
  });
  document.addEventListener('htmx:afterRequest', function (e) {
    if (e.detail.successful) connStatus('');
  });
  /* (g) uPlot line charts: window.npuChart(el[, spec]); spec defaults to JSON in el.dataset.series:
     {"x":[unix s...], "series":[{"label":"AICore %","values":[...]}], "yLabel":"%"} */
  var charts = new Map(); // element -> {u, src, spec}
  var DASH = [undefined, [6, 3], [2, 3], [10, 3, 2, 3], [14, 4], [1, 3]]; // shape cue besides colour
  var ro = window.ResizeObserver ? new ResizeObserver(function (entries) {
    entries.forEach(function (en) { var c = charts.get(en.target); if (c) fit(en.target, c.u); });
  }) : null;
  function cssVar(el, name) { return getComputedStyle(el).getPropertyValue(name).trim(); }
  function fit(el, u) {
    var leg = u.root.querySelector('.u-legend');
    var w = el.clientWidth, h = el.clientHeight - (leg ? leg.offsetHeight : 0);
    if (w > 0 && h > 40 && (w !== u.width || h !== u.height)) u.setSize({ width: w, height: h });
  }
  window.npuChart = function (el, seriesSpec) {
    var old = charts.get(el), src = el.dataset.series || '';
    var explicit = seriesSpec || (old && !src ? old.spec : null), spec = explicit;
    if (old) { old.u.destroy(); charts.delete(el); if (ro) ro.unobserve(el); }
    if (!window.uPlot) return null;
    if (!spec) { try { spec = JSON.parse(src); } catch (e) { spec = null; } }
    el.textContent = '';
    if (!spec || !spec.x || !spec.x.length || !spec.series) {
      var p = document.createElement('p'); p.className = 'empty small'; p.textContent = el.dataset.empty || 'No data';
      el.appendChild(p); return null;
    }
    var muted = cssVar(el, '--text-muted'), grid = cssVar(el, '--chart-grid'), font = '11px ' + cssVar(el, '--font-sans'), unit = spec.yLabel || '';
    var axis = function (extra) {
      return Object.assign({ stroke: muted, font: font, labelFont: font, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } }, extra);
    };
    var u = new window.uPlot({
      width: el.clientWidth || 300, height: el.clientHeight || 180,
      scales: { x: { time: true } },
      axes: [axis({}), axis({ label: unit, labelSize: unit ? 16 : 0, size: 44 })],
      series: [{}].concat(spec.series.map(function (s, i) {
        return {
          label: s.label, width: 1.5, dash: DASH[i % DASH.length], points: { show: false },
          stroke: cssVar(el, '--series-' + (i % 6 + 1)),
          value: function (u, v) { return v == null ? '–' : +v.toFixed(2) + (unit ? ' ' + unit : ''); }
        };
      }))
    }, [spec.x].concat(spec.series.map(function (s) { return s.values; })), el);
    charts.set(el, { u: u, src: src, spec: explicit });
    fit(el, u); if (ro) ro.observe(el);
    return u;
  };
  function initCharts() {
    charts.forEach(function (c, el) { if (!el.isConnected) { c.u.destroy(); if (ro) ro.unobserve(el); charts.delete(el); } });
    $$('.chart[data-series]').forEach(function (el) { var c = charts.get(el); if (!c || c.src !== el.dataset.series) window.npuChart(el); });
  }
  function redrawCharts() { Array.from(charts.keys()).forEach(function (el) { window.npuChart(el, charts.get(el).spec); }); }
  if (darkQuery && darkQuery.addEventListener) darkQuery.addEventListener('change', function () { if (!root.dataset.theme) redrawCharts(); });
  /* boot + after every htmx swap (batched per frame) */
  var queued = false;
  function refresh() {
    queued = false; updateTimes(); initTables(); syncToggles(); initCharts();
    $$('[data-filter-table]').forEach(function (i) { if (i.value) applyFilter(i); });
  }
  function schedule() { if (!queued) { queued = true; requestAnimationFrame(refresh); } }
  ['htmx:afterSwap', 'htmx:afterSettle', 'htmx:load'].forEach(function (n) { document.addEventListener(n, schedule); });
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', refresh); else refresh();
  setInterval(updateTimes, 15000);
})();
