// terminal_rsi run report. Data comes from data.js (window.TRSI_REPORT) and, per episode,
// from episodes/NNNNNN.js (TRSI_EPISODE(id, {...})) loaded on demand with a <script> tag, so
// the page works from file:// with no server and no network. Every piece of run data is
// inserted with textContent (never as HTML): observations may hold arbitrary markup.
"use strict";
(function () {
  const R = window.TRSI_REPORT;
  const episodeCache = {};
  const waiting = {};

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(e.dataset, v);
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }
  function fmt(x, d) {
    if (x === null || x === undefined) return "–";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(d ?? 3);
    if (typeof x === "object") return JSON.stringify(x);
    return String(x);
  }
  function table(headers, rows, attrs) {
    const t = el("table", attrs || {});
    t.appendChild(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { text: h })))));
    const tb = el("tbody");
    for (const r of rows) tb.appendChild(r);
    t.appendChild(tb);
    return t;
  }
  function td(x, cls, d) {
    return el("td", { class: cls || (typeof x === "number" ? "num" : null), text: fmt(x, d) });
  }
  function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1); }
  function fixed(x, d) { return typeof x === "number" ? x.toFixed(d) : "–"; }
  function num(x) {  // training numbers: small ones in exponent notation
    if (typeof x === "number" && !Number.isInteger(x) && x !== 0 && Math.abs(x) < 1e-3) {
      return x.toExponential(2);
    }
    return fmt(x);
  }
  function lines(obj) {
    if (!obj || !Object.keys(obj).length) return "–";
    return Object.entries(obj).map(([k, v]) => `${k} ← ${fmt(v)}`).join("\n");
  }

  // ---------------------------------------------------------------- header, notes
  function renderHeader() {
    const info = document.getElementById("run-info");
    info.textContent = `${R.run} · ${R.single_stage ? "single stage dir" : "run ledger"}` +
      (R.ledger_updated ? ` updated ${R.ledger_updated}` : "") + ` · report built ${R.generated}`;
  }
  function renderNotes() {  // one line per kind of note; the individual notes folded
    const notes = R.notes || (R.warnings || []).map((w) => ({ kind: "other", summary: w,
      items: [w] }));
    if (!notes.length) return;
    document.getElementById("notes").hidden = false;
    const ul = document.getElementById("note-list");
    for (const g of notes) {
      const li = el("li", { class: "note", dataset: { kind: g.kind, count: g.items.length } });
      if (g.items.length === 1) li.textContent = g.summary;
      else li.appendChild(el("details", {}, el("summary", { text: g.summary }),
        el("ul", {}, ...g.items.map((t) => el("li", { text: t })))));
      ul.appendChild(li);
    }
  }

  // ---------------------------------------------------------------- headline
  const DECISION_TEXT = { base: "base", kept: "kept", input: "input handed on",
    bypassed: "bypassed" };
  function validationScore(v) {
    if (!v) return "–";
    let s = pct(v.score);
    if (v.input_score !== null && v.input_score !== undefined) {
      s += ` vs ${pct(v.input_score)} (${v.input})`;
    } else if (v.input) s += ` (input ${v.input}: no score)`;
    return s;
  }
  function decisionCell(v) {
    if (!v) return el("td", { class: "decision", text: "–" });
    return el("td", { class: "decision decision-" + v.decision,
      dataset: { decision: v.decision } },
      el("b", { text: DECISION_TEXT[v.decision] || String(v.decision) }),
      v.reason ? el("div", { class: "reason", text: v.reason }) : null);
  }
  function wallCell(w) {
    const parts = [["train", w.train], ["eval", w.eval], ["validation", w.validation]]
      .filter(([, x]) => x !== null && x !== undefined)
      .map(([name, x]) => `${name} ${x.toFixed(0)} s`);
    return el("td", { class: "num", title: parts.join(" + ") || null,
      text: w.total === null || w.total === undefined ? "–" : w.total.toFixed(0) });
  }
  function headlineRow(r, primary, others) {
    const cells = [td(r.stage), el("td", { class: "status-" + (r.status || "unknown"),
      title: r.error || null, text: fmt(r.status) })];
    if (primary) cells.push(td(pct(r.mean_at_k[primary]), "num"),
      td(pct(r.pass_at_k[primary]), "num"));
    for (const x of others) cells.push(td(pct(r.mean_at_k[x]), "num"));
    cells.push(td(validationScore(r.validation), "num"), decisionCell(r.validation),
      td(fixed(r.ev, 2), "num"), wallCell(r.wall));
    return el("tr", { dataset: { stage: r.stage } }, ...cells);
  }
  function renderHeadline() {
    const H = R.headline || { suites: [], rows: [] };
    const k = H.k ?? "k";
    const [primary, ...others] = H.suites;
    const vk = (H.rows.find((r) => r.validation && r.validation.k) || {}).validation;
    const head = ["stage", "status"];
    if (primary) head.push(`${primary} Mean@${k} (%)`, `${primary} pass@${k} (%)`);
    for (const x of others) head.push(`${x} Mean@${k} (%)`);
    head.push(`validation Mean@${vk ? vk.k : "k"} (%) vs input`, "validation decision",
      "critic EV (eval)", "wall s (train + eval + validation)");
    document.getElementById("headline-table").appendChild(table(head,
      H.rows.map((r) => headlineRow(r, primary, others)), { id: "headline-stages" }));
    const prog = R.plots.find((p) => p.name === "progression");
    document.getElementById("headline-plot").appendChild(prog ? el("figure", {},
      el("img", { src: prog.file, alt: "progression" }),
      el("figcaption", { text: `progression — ${prog.source}` })) :
      el("p", { text: "No progression plot (one stage, or matplotlib missing)." }));
  }

  // ---------------------------------------------------------------- stage details, plots
  function evalSummary(ev) {
    const parts = [];
    for (const [suite, e] of Object.entries(ev || {})) {
      const p = (x) => (typeof x === "number" ? `${pct(x)} %` : "–");
      const bits = [`Mean@${fmt(e.k)} ${p(e.mean_at_k)}`];
      for (const [j, v] of Object.entries(e.pass_at_k || {})) bits.push(`pass@${j} ${p(v)}`);
      if (e.process_reward !== undefined) bits.push(`process ${p(e.process_reward)}`);
      if (e.explained_variance !== undefined) bits.push(`EV ${fmt(e.explained_variance, 2)}`);
      if (e.num_tasks !== undefined) bits.push(`${fmt(e.num_tasks)} tasks`);
      parts.push(`${suite}: ${bits.join(", ")}`);
    }
    return parts.length ? parts.join("\n") : "–";
  }
  function trainCell(obj) {  // every training number of a stage, folded, as a table
    const n = obj ? Object.keys(obj).length : 0;
    if (!n) return td("–");
    const rows = Object.entries(obj).map(([k, v]) => el("tr", {}, td(k), td(num(v), "num")));
    return el("td", {}, el("details", { class: "train-all" },
      el("summary", { text: `${n} number${n === 1 ? "" : "s"}` }),
      table(["key", "value"], rows, { class: "kv-table" })));
  }
  function wallsText(w) {
    return ["train", "eval", "validation"].map((x) => `${x} ${fmt(w[x], 0)}`).join("\n");
  }
  function renderStages() {
    const rows = R.stages.map((s) => el("tr", { dataset: { stage: s.name } },
      td(s.name), td(s.experiment),
      el("td", { class: "status-" + (s.status || "unknown"), text: fmt(s.status) }),
      el("td", { class: "kv", text: wallsText(s.walls || {}) }), td(s.started), td(s.finished),
      el("td", { class: "kv", text: evalSummary(s.eval) }),
      el("td", { class: "kv", text: lines(s.inputs) }),
      el("td", { class: "kv bad" }, s.error ? String(s.error) : "",
        s.traceback ? el("details", {}, el("summary", { text: "error.txt" }),
          el("pre", { text: s.traceback })) : null),
      el("td", { class: "kv", text: `${s.tokenizer}\n${s.divisors}\n` +
        `${(s.shards || []).length} shard(s), ${s.metrics_steps} metric steps` }),
      trainCell(s.train)));
    document.getElementById("stage-table").appendChild(table(
      ["stage", "experiment", "status", "wall s", "started", "finished", "eval", "inputs",
       "error", "read", "training numbers (all)"], rows, { id: "stage-ledger" }));
    renderTrainNumbers();
  }
  function renderTrainNumbers() {  // selected training numbers: one row each, a column a stage
    const box = document.getElementById("train-table");
    const keys = R.train_numbers || [];
    const names = R.stages.map((s) => s.name)
      .filter((n) => keys.some((k) => n in k.values));
    if (!keys.length) { box.appendChild(el("p", { text: "No selected training numbers." })); return; }
    box.appendChild(table(["number", ...names], keys.map((k) => el("tr", {}, td(k.key),
      ...names.map((n) => td(n in k.values ? num(k.values[n]) : "–", "num")))),
    { id: "train-numbers" }));
  }
  function renderPlots() {  // the progression plot is in the headline
    const box = document.getElementById("plot-list");
    const plots = R.plots.filter((p) => p.name !== "progression");
    if (!plots.length) box.appendChild(el("p", { text: "No other plots." }));
    for (const p of plots) {
      box.appendChild(el("figure", {}, el("img", { src: p.file, alt: p.name }),
        el("figcaption", { text: `${p.name} — ${p.source}` })));
    }
  }
  function signed(x, d) {  // a change: its sign always shown
    return typeof x === "number" ? (x > 0 ? "+" : "") + x.toFixed(d) : "–";
  }
  function renderDiagnostics() {  // per stage one row of diagnostics; per family before → after
    const D = R.diagnostics || { columns: [], rows: [], families: [] };
    const box = document.getElementById("diagnostics-table");
    if (!D.rows.length) {
      box.appendChild(el("p", { text: "No training diagnostics in the ledger." }));
    } else {
      box.appendChild(table(["stage", ...D.columns.map((c) => c.title)], D.rows.map((r) =>
        el("tr", { dataset: { stage: r.stage } }, td(r.stage),
          ...D.columns.map((c) => el("td", { class: "num", dataset: { key: c.key },
            text: num(r.values[c.key]) })))), { id: "diagnostics-stages" }));
    }
    const fbox = document.getElementById("diagnostics-family-table");
    if (!D.families.length) {
      fbox.appendChild(el("p", { text: "No per-family results before and after a stage." }));
      return;
    }
    const change = (f) => signed(f.change === null ? null : 100 * f.change, 1);
    const rows = D.families.map((f) => el("tr", { dataset: { stage: f.stage } },
      td(f.stage), td(f.suite), td(f.family), td(pct(f.before), "num"),
      td(pct(f.after), "num"), td(change(f), "num")));
    fbox.appendChild(table(["stage", "suite", "family", "before (%)", "after (%)",
      "change (points)"], rows, { id: "diagnostics-families" }));
  }
  function renderFamilies() {
    const rows = R.families.map((f) => el("tr", {}, td(f.stage), td(f.source), td(f.family),
      td(f.n), td(f.success), td(f.mean_p_over_n), td(f.fdr), td(f.spr)));
    const box = document.getElementById("family-table");
    if (!rows.length) { box.appendChild(el("p", { text: "No verified episodes." })); return; }
    box.appendChild(table(["stage", "source", "family", "n", "success", "mean P/N",
      "FDR mean", "SPR mean"], rows, { id: "family-stats" }));
  }

  // ---------------------------------------------------------------- trajectory browser
  const filters = { stage: "", shard: "", family: "", outcome: "", reason: "", credit: "" };
  function uniq(key) { return [...new Set(R.episodes.map((e) => e[key]))].sort(); }
  function renderFilters() {
    const box = document.getElementById("filters");
    const mk = (key, label, options) => {
      const sel = el("select", { id: "filter-" + key, onchange: (ev) => {
        filters[key] = ev.target.value; renderList(); } },
        el("option", { value: "", text: "all" }),
        ...options.map(([v, t]) => el("option", { value: v, text: t })));
      box.appendChild(el("label", {}, label, sel));
    };
    mk("stage", "stage", R.stages.map((s) => [s.name, s.name]));
    mk("shard", "shard", uniq("shard").map((v) => [v, v]));
    mk("family", "family", uniq("family").map((v) => [v, v]));
    mk("outcome", "outcome", [["1", "success (S=1)"], ["0", "failure (S=0)"]]);
    mk("reason", "terminal reason", uniq("reason").map((v) => [String(v), String(v)]));
    mk("credit", "credit", [["1", "with credit arrays"]]);
  }
  function matches(e) {
    return (!filters.stage || e.stage === filters.stage) &&
      (!filters.shard || e.shard === filters.shard) &&
      (!filters.family || e.family === filters.family) &&
      (!filters.outcome || String(e.S) === filters.outcome) &&
      (!filters.reason || String(e.reason) === filters.reason) &&
      (!filters.credit || e.credit);
  }
  const LIST_LIMIT = 500;
  let selected = null;
  function renderList() {
    const shown = R.episodes.filter(matches);
    const count = document.getElementById("episode-count");
    count.dataset.count = String(shown.length);
    count.textContent = `${shown.length} of ${R.episodes.length} episodes` +
      (shown.length > LIST_LIMIT ? ` (listing the first ${LIST_LIMIT})` : "");
    const rows = shown.slice(0, LIST_LIMIT).map((e) => el("tr", {
      class: "episode" + (e.id === selected ? " selected" : ""), dataset: { episode: e.id },
      onclick: () => openEpisode(e.id) },
      td(e.id), td(e.stage), td(e.shard), td(e.task_id), td(e.family),
      el("td", { class: e.S ? "ok" : "bad", text: e.S ? "S=1" : "S=0" }),
      td(`${e.P}/${e.N}`), td(e.reward), td(e.reason), td(e.turns),
      td(e.credit ? "✓" : "")));
    const box = document.getElementById("episode-list");
    box.replaceChildren(table(["#", "stage", "shard", "task", "family", "S", "P/N",
      "reward", "terminal reason", "turns", "credit"], rows, { id: "episode-table" }));
  }
  window.TRSI_EPISODE = function (id, data) {
    episodeCache[id] = data;
    for (const cb of waiting[id] || []) cb(data);
    delete waiting[id];
  };
  function loadEpisode(id, cb) {
    if (episodeCache[id]) { cb(episodeCache[id]); return; }
    if (waiting[id]) { waiting[id].push(cb); return; }
    waiting[id] = [cb];
    const meta = R.episodes[id];
    const s = el("script", { src: meta.file });
    s.onerror = () => {
      delete waiting[id];
      document.getElementById("episode-detail").replaceChildren(
        el("p", { class: "bad", text: `cannot load ${meta.file}` }));
    };
    document.body.appendChild(s);
  }
  function openEpisode(id) {
    selected = id;
    for (const tr of document.querySelectorAll("#episode-list tr.episode")) {
      tr.classList.toggle("selected", Number(tr.dataset.episode) === id);
    }
    const box = document.getElementById("episode-detail");
    box.dataset.loaded = "";
    box.replaceChildren(el("p", { text: "loading…" }));
    loadEpisode(id, (d) => { renderEpisode(R.episodes[id], d); });
  }
  window.trsiOpenEpisode = openEpisode;

  function renderChecks(d) {
    const box = el("div", { id: "checks" }, el("h3", { text: "Verifier checks" }));
    const rep = d.report;
    if (!rep) {
      box.appendChild(el("p", { class: "bad", text: "no verification report" +
        (d.error ? `: ${d.error}` : "") }));
      return box;
    }
    box.appendChild(el("p", {},
      el("span", { class: rep.valid ? "ok" : "bad", text: rep.valid ? "valid report" :
        "invalid report" }),
      ` · strict success S=${rep.strict_success ? 1 : 0} · P=${rep.passed} of N=${rep.total}` +
      ` · failed ${rep.failed}, skipped ${rep.skipped}, pending ${rep.pending}, other ${rep.other}` +
      (rep.shape ? ` · shape ${rep.shape}` : "")));
    const ul = el("ul", { class: "checks" });
    if (d.checks) {
      for (const c of d.checks) {
        const ok = c.status === "passed";
        ul.appendChild(el("li", { class: "check", dataset: { status: c.status,
          hygiene: c.hygiene ? "1" : "0" } },
          el("span", { class: ok ? "ok" : "bad", text: ok ? "✓ " : "✗ " }),
          String(c.name), el("span", { class: "badge", text: String(c.status) }),
          c.hygiene ? el("span", { class: "badge hygiene", text: "hygiene (not in P/N)" }) : null));
      }
    } else {
      if (rep.passed) ul.appendChild(el("li", { class: "check", dataset: { status: "passed" } },
        el("span", { class: "ok", text: "✓ " }), `${rep.passed} non-hygiene check(s) passed`));
      const bad = rep.total - rep.passed;
      if (bad) ul.appendChild(el("li", { class: "check", dataset: { status: "failed" } },
        el("span", { class: "bad", text: "✗ " }), `${bad} non-hygiene check(s) not passed`));
      for (const [name, status] of rep.hygiene_checks || []) {
        const ok = status === "passed";
        ul.appendChild(el("li", { class: "check", dataset: { status: status, hygiene: "1" } },
          el("span", { class: ok ? "ok" : "bad", text: ok ? "✓ " : "✗ " }), String(name),
          el("span", { class: "badge", text: String(status) }),
          el("span", { class: "badge hygiene", text: "hygiene (not in P/N)" })));
      }
    }
    box.appendChild(ul);
    for (const [key, cls] of [["problems", "bad"], ["warnings", ""]]) {
      if (rep[key] && rep[key].length) {
        box.appendChild(el("p", { class: cls, text: `${key}: ${rep[key].join("; ")}` }));
      }
    }
    return box;
  }

  function renderEpisode(meta, d) {
    const box = document.getElementById("episode-detail");
    const rw = d.rewards || {};
    const head = el("div", { id: "episode-head" },
      el("h3", { text: `Episode #${meta.id}: ${d.task_id}` }),
      el("p", { text: `stage ${meta.stage} · shard ${meta.shard}[${meta.index}] · family ` +
        `${d.family} · harness ${d.harness} · policy v${meta.policy_version} · ` +
        `terminal reason ${d.reason}` + (d.error ? ` · error: ${d.error}` : "") }),
      el("p", {},
        el("b", { class: d.S ? "ok" : "bad", text: `S=${d.S}` }),
        ` P=${d.P} N=${d.N} · reward ${fmt(d.reward)} (${d.reward_fn || "?"}) · ` +
        `FDR ${fmt(rw.fdr)} · SPR ${fmt(rw.spr)} · binary ${fmt(rw.binary)}`));
    const instr = el("div", {}, el("h3", { text: "Instruction" }),
      el("pre", { id: "instruction", text: d.instruction }));
    const turns = el("div", { id: "turns" }, el("h3", { text: `Turns (${d.turns.length})` }));
    for (const t of d.turns) {
      turns.appendChild(el("div", { class: "turn", dataset: { turn: t.index } },
        el("h4", { text: `Turn ${t.index}` + (t.segment ? ` (segment ${t.segment})` : "") +
          ` · ${t.n_sampled} generated tokens · stop ${t.stop_reason || "?"}` }),
        t.prompt ? el("details", { class: "prompt" }, el("summary", { class: "label",
          text: "prompt rendered at this turn (click to show)" }),
          el("pre", { text: t.prompt })) : null,
        el("div", { class: "label", text: "action (sampled ids, decoded)" }),
        el("pre", { class: "action", text: t.action }),
        t.parse_error ? el("p", { class: "bad", text: `parse error: ${t.parse_error}` }) : null,
        el("div", { class: "label", text: `observation (${t.n_observation} tokens)` }),
        el("pre", { class: "observation", text: t.observation || "(none: last turn of segment)" })));
    }
    const extra = el("details", { id: "episode-meta" }, el("summary", { class: "label",
      text: "meta, timings, segments" }), el("pre", { text: JSON.stringify(
        { meta: d.meta, timings: d.timings, segments: d.segments,
          declared_complete_turn: d.declared_complete_turn }, null, 1) }));
    box.replaceChildren(head, instr, renderChecks(d), renderHeatmap(d), turns, extra);
    box.dataset.loaded = String(meta.id);
  }

  // ---------------------------------------------------------------- heatmap
  let hmMode = "adv";
  function color(x, mode, scale) {
    if (x === null || x === undefined) return "#ddd";
    if (mode === "adv") {
      const a = Math.min(1, Math.abs(x) / (scale || 1));
      return x >= 0 ? `rgba(20,150,60,${(0.08 + 0.85 * a).toFixed(3)})`
        : `rgba(210,30,40,${(0.08 + 0.85 * a).toFixed(3)})`;
    }
    const [lo, hi] = scale;
    const a = hi > lo ? (x - lo) / (hi - lo) : 0.5;
    return `rgba(40,90,200,${(0.08 + 0.85 * a).toFixed(3)})`;
  }
  function renderHeatmap(d) {
    const wrap = el("div", { id: "credit" }, el("h3", { text: "Token-level credit (TB-GAE)" }));
    if (!d.credit || !d.credit.length) {
      wrap.appendChild(el("p", { id: "no-credit", text: "No credit arrays for this episode " +
        "(only training step shards carry a .credit.npz)." }));
      return wrap;
    }
    let amax = 0, vlo = Infinity, vhi = -Infinity;
    for (const row of d.credit) for (const s of row.spans) if (s.k === "gen") {
      for (const a of s.adv) if (a !== null) amax = Math.max(amax, Math.abs(a));
      for (const v of s.val) if (v !== null) { vlo = Math.min(vlo, v); vhi = Math.max(vhi, v); }
    }
    const legend = el("span", { class: "hm-legend" });
    const hm = el("div", { id: "heatmap" });
    const draw = () => {
      const scale = hmMode === "adv" ? amax : [vlo, vhi];
      legend.replaceChildren(...(hmMode === "adv" ? [
        el("span", { class: "swatch", style: "background:linear-gradient(90deg," +
          "rgba(210,30,40,.93),rgba(210,30,40,.08),rgba(20,150,60,.08),rgba(20,150,60,.93))" }),
        ` advantage in [${fmt(-amax)}, ${fmt(amax)}]`] : [
        el("span", { class: "swatch", style: "background:linear-gradient(90deg," +
          "rgba(40,90,200,.08),rgba(40,90,200,.93))" }),
        ` critic value in [${fmt(vlo)}, ${fmt(vhi)}]`]));
      const parts = [];
      for (const row of d.credit) {
        if (d.credit.length > 1) parts.push(el("span", { class: "seg-mark",
          text: `segment ${row.segment} (${row.length} tokens)` }));
        let lastTurn = null;
        for (const s of row.spans) {
          if (s.k === "skip") {
            const chip = el("span", { class: "skip", dataset: { what: s.what, n: s.n },
              title: s.text, text: `⟨${s.what}: ${s.n} tokens skipped⟩` });
            chip.addEventListener("click", () => {
              const open = chip.nextSibling && chip.nextSibling.classList &&
                chip.nextSibling.classList.contains("skip-text");
              if (open) chip.nextSibling.remove();
              else chip.after(el("span", { class: "skip-text", text: s.text }));
            });
            parts.push(chip);
            continue;
          }
          if (s.turn !== lastTurn) {
            parts.push(el("span", { class: "turn-mark", dataset: { turn: s.turn },
              text: `turn ${s.turn}` }));
            lastTurn = s.turn;
          }
          for (let i = 0; i < s.tok.length; i++) {
            const x = hmMode === "adv" ? s.adv[i] : s.val[i];
            parts.push(el("span", { class: "tk" + (s.done[i] ? " done-mark" : ""),
              style: `background:${color(x, hmMode, scale)}`,
              title: `turn ${s.turn} · pos ${s.start + i} · id ${s.ids[i]}\n` +
                `advantage ${fmt(s.adv[i], 4)} · value ${fmt(s.val[i], 4)} · ` +
                `return ${fmt(s.ret[i], 4)}` + (s.rew[i] ? ` · reward ${fmt(s.rew[i], 4)}` : "") +
                (s.done[i] ? " · done" : ""),
              text: s.tok[i] }));
          }
        }
      }
      hm.replaceChildren(...parts);
    };
    const modeSel = el("select", { id: "heatmap-mode", onchange: (ev) => {
      hmMode = ev.target.value; draw(); } },
      el("option", { value: "adv", text: "TB-GAE advantage" }),
      el("option", { value: "val", text: "critic value" }));
    modeSel.value = hmMode;
    wrap.appendChild(el("div", { class: "hm-controls" }, el("label", {}, "colour by ", modeSel),
      legend));
    wrap.appendChild(el("p", { class: "label", text: "generated tokens only are coloured; " +
      "turn boundaries are black tags; prompt and observation spans are not recursion " +
      "nodes and are collapsed (click a chip to see its text); hover a token for numbers" }));
    wrap.appendChild(hm);
    draw();
    // per-turn summary: TB-GAE's recursion steps across turns, so these are the numbers
    // that carry credit between turns
    const rows = [];
    for (const row of d.credit) for (const s of row.spans) if (s.k === "gen") {
      const adv = s.adv.filter((x) => x !== null);
      rows.push(el("tr", { class: "turn-credit" }, td(row.segment), td(s.turn), td(s.tok.length),
        td(adv.length ? adv.reduce((a, b) => a + b, 0) / adv.length : null, null, 4),
        td(s.adv[0], null, 4), td(s.val[0], null, 4), td(s.ret[0], null, 4),
        td(s.rew.reduce((a, b) => a + (b || 0), 0), null, 4)));
    }
    wrap.appendChild(el("h4", { text: "Per turn" }));
    wrap.appendChild(table(["segment", "turn", "tokens", "mean A", "A first token",
      "V first token", "return first token", "reward"], rows, { id: "turn-credit" }));
    return wrap;
  }

  // ---------------------------------------------------------------- main
  function main() {
    if (!R) {
      document.body.appendChild(el("p", { class: "bad", text: "data.js did not load" }));
      return;
    }
    renderHeader();
    renderHeadline();
    renderNotes();
    renderPlots();
    renderStages();
    renderDiagnostics();
    renderFamilies();
    renderFilters();
    renderList();
    document.body.dataset.ready = "1";
  }
  main();
})();
