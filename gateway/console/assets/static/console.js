// macfleet console: live refresh of the server-rendered pages, and the playground.
// The pages are complete without this script.
"use strict";
(function () {
  const main = document.getElementById("main");
  const poll = Number(document.body.dataset.poll) || 2000;

  // Live pages: fetch the same URL every poll interval and swap <main> in place.
  async function refresh() {
    if (document.hidden) return;
    try {
      const res = await fetch(location.pathname + location.search, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!res.ok || res.redirected) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const next = doc.getElementById("main");
      if (next) main.replaceChildren(...next.childNodes);
    } catch (e) {
      // The gateway restarting; the next tick tries again.
    }
  }
  if (main && main.hasAttribute("data-live")) setInterval(refresh, poll);

  // Playground: stream a chat completion through the gateway's public API.
  const form = document.getElementById("playground");
  if (!form) return;
  const out = document.getElementById("pg-answer");
  const status = document.getElementById("pg-status");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    out.textContent = "";
    status.textContent = "Waiting for the first token…";
    const body = {
      model: form.model.value,
      stream: true,
      max_tokens: Number(form.max_tokens.value) || 64,
      messages: [{ role: "user", content: form.prompt.value }],
    };
    const started = performance.now();
    let tokens = 0;
    try {
      const res = await fetch("/ui/chat", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-Macfleet-Console": "playground" },
        body: JSON.stringify(body),
      });
      if (!res.ok) {
        const text = await res.text();
        let msg = text;
        try { msg = JSON.parse(text).error.message; } catch (e) { /* plain text */ }
        throw new Error(res.status + ": " + msg);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            out.textContent += delta.content;
            tokens++;
            status.textContent = "Streaming…";
          }
        }
      }
      const secs = (performance.now() - started) / 1000;
      status.textContent = "Done: " + tokens + " chunks in " + secs.toFixed(2) + " s.";
      out.dataset.done = "true";
    } catch (e) {
      status.textContent = "Failed: " + e.message;
      out.dataset.done = "error";
    } finally {
      button.disabled = false;
    }
  });
})();
