/* Incident queue keys: j/k move the selection, Enter opens it, a acknowledges it. */
(function () {
  'use strict';
  function rows() {
    var table = document.querySelector('table[data-incident-queue]');
    return table ? Array.prototype.filter.call(table.tBodies[0].rows, function (r) { return !r.hidden && r.style.display !== 'none'; }) : [];
  }
  var index = -1;
  function select(i) {
    var all = rows();
    if (!all.length) return;
    index = Math.max(0, Math.min(all.length - 1, i));
    all.forEach(function (r, k) { r.setAttribute('aria-selected', k === index ? 'true' : 'false'); });
    all[index].scrollIntoView({ block: 'nearest' });
  }
  document.addEventListener('keydown', function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName)))) return;
    var all = rows();
    if (!all.length) return;
    if (e.key === 'j') { select(index + 1); e.preventDefault(); }
    else if (e.key === 'k') { select(index - 1); e.preventDefault(); }
    else if (e.key === 'Enter' && all[index]) { window.location = all[index].getAttribute('data-incident-url'); e.preventDefault(); }
    else if (e.key === 'a' && all[index]) {
      var form = all[index].querySelector('form[data-ack-form]');
      if (form) { form.submit(); e.preventDefault(); }
    }
  });
})();
