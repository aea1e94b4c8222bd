// delayq dashboard: live counts on the overview, and a confirmation before destructive
// actions. Everything else is plain server-rendered HTML.
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

const live = document.querySelector("[data-live]");
if (live) {
  const stamp = document.querySelector("[data-stamp]");
  const refresh = async () => {
    try {
      const response = await fetch(live.dataset.live, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      for (const q of await response.json()) {
        for (const cell of live.querySelectorAll("[data-f]")) {
          if (cell.dataset.q !== q.queue || !(cell.dataset.f in q)) continue;
          const link = cell.querySelector("a");
          (link || cell).textContent = q[cell.dataset.f];
        }
      }
      if (stamp) stamp.textContent = `Updated ${new Date().toLocaleTimeString()}.`;
    } catch (error) {
      if (stamp) stamp.textContent = `Update failed (${error.message}); retrying.`;
    }
  };
  setInterval(refresh, 2000);
}
