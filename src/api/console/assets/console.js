// fairway console: live overview (SSE), tenant actions, schedule pause/resume, job cancel, DLQ replay.
// No framework; every action is a POST with the page's CSRF token.
"use strict";

const csrf = document.querySelector('meta[name="csrf"]')?.content || "";
const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

async function post(path, body) {
  const r = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body ?? {}),
    credentials: "same-origin",
  });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data.error || r.statusText);
  return data;
}

function say(el, text, bad) {
  if (!el) return;
  el.textContent = text;
  el.className = bad ? "error" : "ok";
}

$("#logout")?.addEventListener("click", async () => {
  await post("/console/logout").catch(() => {});
  location.href = "/console/login";
});

// ---- overview ------------------------------------------------------------------
const HISTORY = 60;
const history = {};

function spark(values) {
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${(i * 110) / (HISTORY - 1)},${22 - (v / max) * 20}`).join(" ");
  return `<svg class="spark" viewBox="0 0 110 24"><polyline points="${pts}"/></svg>`;
}

function ageText(ms) {
  if (ms == null) return "–";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

function renderPools(view) {
  const root = $("#pools");
  if (!root) return;
  if (view.error) say($("#live-status"), view.error, true);
  else say($("#live-status"), `live · ${view.workers} worker snapshot(s) · ${new Date(view.at).toLocaleTimeString()}`);
  if (!view.pools.length) {
    root.innerHTML = '<p class="hint" id="no-workers">No live workers report yet.</p>';
    return;
  }
  root.className = "cards";
  root.innerHTML = view.pools
    .map((p) => {
      const h = (history[p.pool] ||= { tput: [], running: [], backlog: [] });
      const metric = (name, label, value, series) =>
        `<div class="metric"><span>${label}</span><span><span class="v" data-metric="${name}">${value}</span>${series ? spark(series) : ""}</span></div>`;
      const r = p.rates;
      return `<div class="card" data-pool="${esc(p.pool)}"><h2>${esc(p.pool)}</h2>
        ${metric("throughput", "Throughput (jobs/s)", r.finished_per_sec.toFixed(1), h.tput)}
        ${metric("running", "Running / slots", `${p.running} / ${p.slots}`, h.running)}
        ${metric("backlog", "Backlog (spilled)", `${p.backlog} (${p.spilled})`, h.backlog)}
        ${metric("oldest", "Oldest waiting", ageText(p.oldest_wait_ms))}
        ${metric("failures", "Failure rate (1 min)", `${(r.failure_rate * 100).toFixed(0)}% of ${r.finished}`)}
        ${metric("breakers", "Breakers open", p.breakers_open.length ? esc(p.breakers_open.join(", ")) : "none")}
        ${metric("workers", "Workers", p.workers)}</div>`;
    })
    .join("");
}

function record(view) {
  for (const p of view.pools) {
    const h = (history[p.pool] ||= { tput: [], running: [], backlog: [] });
    for (const [k, v] of [["tput", p.rates.finished_per_sec], ["running", p.running], ["backlog", p.backlog]]) {
      h[k].push(v);
      if (h[k].length > HISTORY) h[k].shift();
    }
  }
}

if ($("#pools")) {
  const initial = JSON.parse($("#pools").dataset.initial || "null");
  if (initial) { record(initial); renderPools(initial); }
  const es = new EventSource("/console/api/overview");
  es.addEventListener("sample", (ev) => { const v = JSON.parse(ev.data); record(v); renderPools(v); });
  es.onerror = () => say($("#live-status"), "reconnecting…", true);
}

// ---- tenants -------------------------------------------------------------------
for (const b of $$("button.set-tier")) {
  b.addEventListener("click", async () => {
    const tenant = b.dataset.tenant;
    const tier = $(`select.tier[data-tenant="${CSS.escape(tenant)}"]`).value;
    try { await post(`/console/api/tenants/${encodeURIComponent(tenant)}`, { tier }); location.reload(); }
    catch (e) { say($("#action-result"), e.message, true); }
  });
}
for (const b of $$("button.suspend")) {
  b.addEventListener("click", async () => {
    try {
      await post(`/console/api/tenants/${encodeURIComponent(b.dataset.tenant)}`, { suspended: b.dataset.suspended === "true" });
      location.reload();
    } catch (e) { say($("#action-result"), e.message, true); }
  });
}

// ---- schedules -----------------------------------------------------------------
for (const b of $$("button.pause-schedule")) {
  b.addEventListener("click", async () => {
    const path = `/console/api/schedules/${encodeURIComponent(b.dataset.tenant)}/${encodeURIComponent(b.dataset.name)}`;
    try { await post(path, { paused: b.dataset.paused === "true" }); location.reload(); }
    catch (e) { say($("#action-result"), e.message, true); }
  });
}

// ---- job detail ----------------------------------------------------------------
$("#cancel")?.addEventListener("click", async (ev) => {
  const id = ev.target.dataset.job;
  try { const r = await post(`/console/api/jobs/${encodeURIComponent(id)}/cancel`); say($("#action-result"), r.message); }
  catch (e) { say($("#action-result"), e.message, true); }
});

// ---- DLQ replay ----------------------------------------------------------------
function replayRequest(dryRun) {
  const form = $("#dlq-filters");
  const body = Object.fromEntries(new FormData(form).entries());
  body.job_ids = $$("input.pick:checked").map((c) => c.value);
  body.rate = Number($("#rate").value) || 10;
  body.dry_run = dryRun;
  return body;
}

function reportHtml(r) {
  const rows = (r.sample || []).map((s) =>
    `<tr><td>${esc(s.job_id)}</td><td>${esc(s.tenant)}</td><td>${esc(s.job_type)}</td><td>${esc(s.class)}</td><td>${esc(s.decision)}</td><td>${esc(s.last_error)}</td></tr>`).join("");
  const skipped = Object.entries(r.skipped || {}).filter(([, n]) => n).map(([k, n]) => `${k} ${n}`).join(", ") || "none";
  return `<p>Scanned ${r.scanned}, matched ${r.matched}; <b id="would-replay">${r.dry_run ? r.would_replay : r.replayed}</b> job(s) ${r.dry_run ? "would be" : "were"} replayed; skipped: ${esc(skipped)}.</p>
    <table><thead><tr><th>Job</th><th>Tenant</th><th>Type</th><th>Class</th><th>Decision</th><th>Last error</th></tr></thead><tbody>${rows}</tbody></table>`;
}

let pending = null;
$("#preview")?.addEventListener("click", async () => {
  const out = $("#preview-result");
  say(out, "previewing (dry run)…");
  $("#confirm").hidden = true;
  try {
    pending = replayRequest(true);
    const r = await post("/console/api/replays", pending);
    out.className = "";
    out.innerHTML = reportHtml(r);
    if (r.would_replay > 0) {
      $("#confirm-replay").textContent = `Replay ${r.would_replay} job(s) at ${pending.rate}/s`;
      $("#confirm").hidden = false;
    }
  } catch (e) { say(out, e.message, true); }
});
$("#cancel-replay")?.addEventListener("click", () => { $("#confirm").hidden = true; pending = null; });
$("#confirm-replay")?.addEventListener("click", async () => {
  if (!pending) return;
  const req = { ...pending, dry_run: false };
  $("#confirm").hidden = true;
  const out = $("#replay-progress");
  try {
    const { run } = await post("/console/api/replays", req);
    const es = new EventSource(`/console/api/replays/${run}`);
    es.addEventListener("progress", (ev) => {
      const p = JSON.parse(ev.data);
      if (p.error) { say(out, `replay failed: ${p.error}`, true); es.close(); return; }
      if (p.done) {
        out.className = "";
        out.innerHTML = `<p id="replay-done" class="ok">Replay finished: ${p.replayed} job(s) replayed (${esc(p.stopped)}).</p>` + reportHtml(p);
        es.close();
        return;
      }
      say(out, `replaying… scanned ${p.scanned}, matched ${p.matched}, replayed ${p.replayed}`);
    });
    es.onerror = () => es.close();
  } catch (e) { say(out, e.message, true); }
});
