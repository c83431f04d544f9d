/* A replica's log page (templates/logs/replica.html): the view follows new lines while it is
   scrolled to the bottom, or opens at the #L<n> line a link named. The Pause button and the
   poll's pause while the tab is hidden are console.js's (data-poll-pause, section b). */
(function () {
  'use strict';
  function init() {
    var box = document.getElementById('log-lines');
    if (!box) return;
    var stick = !location.hash;
    if (stick) box.scrollTop = box.scrollHeight;
    else { var at = document.getElementById(location.hash.slice(1)); if (at) at.scrollIntoView({ block: 'center' }); }
    box.addEventListener('scroll', function () { stick = box.scrollTop + box.clientHeight >= box.scrollHeight - 8; });
    document.body.addEventListener('htmx:oobAfterSwap', function () { if (stick) box.scrollTop = box.scrollHeight; });
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init); else init();
})();
