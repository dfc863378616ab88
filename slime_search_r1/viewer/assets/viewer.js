// Search-R1 trajectory viewer: draws the data embedded in this page (slime_search_r1/viewer/page.py writes it).
// Rule of this file: text from a sample only ever reaches the document through textContent / createTextNode, never
// through innerHTML, so retrieved passages holding markup or special-token text are shown as the text they are.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("viewer-data").textContent);
  const LIST_STEP = 500; // rows drawn at once; "show more" draws the next ones
  const SERIES_LABELS = {
    rollout_log_probs: "rollout log prob",
    log_probs: "train log prob",
    ref_log_probs: "reference log prob",
    advantages: "advantage",
    entropy: "entropy",
    returns: "return",
    kl: "kl",
    values: "value",
    teacher_log_probs: "teacher log prob",
    loss_masks: "train loss mask",
  };
  const state = {
    run: 0,
    filters: { status: "", em: "", source: "", rewardMin: "", rewardMax: "", failedCall: false, truncated: false, text: "" },
    sort: { key: "p", up: true },
    limit: LIST_STEP,
    visible: [], // positions of the rows passing the filters, in list order
    threshold: DATA.threshold,
  };

  // ---- small DOM helpers (text only) ----------------------------------------------------------------------------
  function h(tag, props, children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [key, value] of Object.entries(props)) {
        if (value === undefined || value === null) continue;
        if (key === "class") node.className = value;
        else if (key === "text") node.textContent = value;
        else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
        else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
        else node.setAttribute(key, value);
      }
    }
    for (const child of children || []) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }
  function fmt(value, digits) {
    if (value === null || value === undefined) return "-";
    if (typeof value === "boolean") return value ? "1" : "0";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return String(value);
    return value.toFixed(digits === undefined ? 3 : digits);
  }
  function pretty(value) {
    return JSON.stringify(value, null, 2);
  }

  // ---- token text: the page's vocabulary, joined byte-exactly -----------------------------------------------------
  const VOCAB_TEXT = DATA.vocab.t;
  const VOCAB_BYTES = DATA.vocab.b;
  const SPECIAL = new Set(DATA.vocab.s);
  const HAS_VOCAB = Object.keys(VOCAB_TEXT).length + Object.keys(VOCAB_BYTES).length > 0;
  const encoder = new TextEncoder();
  const byteCache = new Map();

  function base64Bytes(text) {
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }
  function typedArray(value, Type, length) {
    if (value === undefined || value === null) return null;
    if (typeof value === "number") return new Type(length).fill(value); // a constant series, stored once
    const bytes = base64Bytes(value);
    return new Type(bytes.buffer, 0, bytes.length / Type.BYTES_PER_ELEMENT);
  }
  // The text of each token. A token holding part of a UTF-8 character gets "" and the token that completes it the
  // character, so the texts put end to end are the decoded response.
  function tokenTexts(ids) {
    const out = new Array(ids.length);
    const decoder = new TextDecoder("utf-8");
    let pending = false;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      const text = VOCAB_TEXT[id];
      if (text !== undefined && !pending) {
        out[i] = text;
        continue;
      }
      let bytes;
      if (text !== undefined) bytes = encoder.encode(text);
      else if (VOCAB_BYTES[id] !== undefined) {
        if (!byteCache.has(id)) byteCache.set(id, base64Bytes(VOCAB_BYTES[id]));
        bytes = byteCache.get(id);
      } else {
        out[i] = null; // no tokenizer was given for this page
        continue;
      }
      out[i] = decoder.decode(bytes, { stream: true });
      pending = VOCAB_BYTES[id] !== undefined;
    }
    const rest = decoder.decode();
    if (rest && ids.length) out[ids.length - 1] = (out[ids.length - 1] || "") + rest;
    return out;
  }

  // ---- page frame ---------------------------------------------------------------------------------------------------
  function drawFrame() {
    document.title = DATA.title;
    document.getElementById("title").textContent = DATA.title;
    const about = [`generated ${DATA.generated}`];
    about.push(DATA.tokenizer ? `tokenizer ${DATA.tokenizer}` : "no tokenizer: tokens shown by id");
    document.getElementById("about").textContent = about.join(" · ");
    const nav = clear(document.getElementById("runs"));
    DATA.runs.forEach((run, index) => {
      nav.appendChild(h("button", { text: run.name, data: { run: index }, onclick: () => go(index, null) }));
    });
    const messages = clear(document.getElementById("messages"));
    for (const warning of DATA.warnings) messages.appendChild(h("div", { class: "warning", text: warning }));
    if (!DATA.runs.length) messages.appendChild(h("div", { class: "warning", text: "The inputs held no samples." }));
  }

  // ---- run view: summary, filters, list --------------------------------------------------------------------------
  function metricsTable(caption, metrics, kind) {
    const rows = Object.entries(metrics).map(([name, value]) =>
      h("tr", null, [h("td", { text: name }), h("td", { class: "value", text: fmt(value), data: { metric: name, kind: kind, value: String(value) } })])
    );
    return h("table", { class: "metrics", data: { kind: kind } }, [h("caption", { text: caption }), h("tbody", null, rows)]);
  }

  function drawRun() {
    const run = DATA.runs[state.run];
    document.querySelectorAll("nav#runs button").forEach((b) => b.classList.toggle("current", Number(b.dataset.run) === state.run));
    document.getElementById("run-name").textContent = run.name;
    const source = [`from ${run.source}`];
    if (run.train_sources.length) source.push(`train side from ${run.train_sources.join(", ")}`);
    document.getElementById("run-source").textContent = source.join("; ");
    const summary = clear(document.getElementById("summary"));
    summary.appendChild(metricsTable(`The log hooks' metrics (logged as ${run.prefix}<name>), over ${run.total} samples`, run.hooks, "hook"));
    for (const alarm of run.alarms || []) summary.appendChild(h("div", { class: "warning", text: `collapse warning: ${alarm}`, data: { alarm: "" } }));
    summary.appendChild(metricsTable("The viewer's own figures (not logged)", run.viewer, "viewer"));
    for (const note of run.notes) summary.appendChild(h("div", { class: "note", text: note }));
    if (run.rows.length < run.total) {
      summary.appendChild(h("div", { class: "note", text: `This page holds ${run.rows.length} of the run's ${run.total} samples (the first ${DATA.per_source} of each data source); the figures count all ${run.total}.` }));
    }
    drawFilters(run);
    state.limit = LIST_STEP;
    drawList();
  }

  function options(values) {
    return ["", ...values].map((value) => h("option", { value: value, text: value === "" ? "any" : value }));
  }

  function drawFilters(run) {
    const box = clear(document.getElementById("filters"));
    const distinct = (key) => [...new Set(run.rows.map((r) => r[key]).filter((v) => v !== null && v !== undefined))].sort();
    const f = state.filters;
    const select = (name, label, values) => {
      const node = h("select", { name: name, onchange: (e) => { f[name] = e.target.value; refreshList(); } }, options(values));
      node.value = values.includes(f[name]) ? f[name] : (f[name] = "");
      return h("label", null, [label, node]);
    };
    const number = (name, label) => {
      const node = h("input", { type: "number", step: "any", name: name, oninput: (e) => { f[name] = e.target.value; refreshList(); } });
      node.value = f[name];
      return h("label", null, [label, node]);
    };
    const check = (name, label) => {
      const node = h("input", { type: "checkbox", name: name, onchange: (e) => { f[name] = e.target.checked; refreshList(); } });
      node.checked = f[name];
      return h("label", null, [node, label]);
    };
    const text = h("input", { type: "search", name: "text", placeholder: "question or answer", oninput: (e) => { f.text = e.target.value; refreshList(); } });
    text.value = f.text;
    box.appendChild(select("status", "status", distinct("status")));
    box.appendChild(select("em", "EM", ["1", "0", "unscored"]));
    box.appendChild(select("source", "data source", distinct("source").map(String)));
    box.appendChild(number("rewardMin", "reward ≥"));
    box.appendChild(number("rewardMax", "reward ≤"));
    box.appendChild(check("failedCall", "failed tool call"));
    box.appendChild(check("truncated", "truncated"));
    box.appendChild(h("label", null, ["search", text]));
  }

  function passes(row) {
    const f = state.filters;
    if (f.status && row.status !== f.status) return false;
    if (f.em === "unscored" && row.em !== null) return false;
    if ((f.em === "1" || f.em === "0") && (row.em === null || row.em !== Number(f.em))) return false;
    if (f.source && String(row.source) !== f.source) return false;
    if (f.rewardMin !== "" && !(row.reward !== null && row.reward >= Number(f.rewardMin))) return false;
    if (f.rewardMax !== "" && !(row.reward !== null && row.reward <= Number(f.rewardMax))) return false;
    if (f.failedCall && !row.failed_call) return false;
    if (f.truncated && !row.truncated) return false;
    if (f.text) {
      const needle = f.text.toLowerCase();
      const hay = `${row.q} ${row.answer || ""} ${(row.answers || []).join(" ")}`.toLowerCase();
      if (!hay.includes(needle)) return false;
    }
    return true;
  }

  const COLUMNS = [
    ["p", "#", (r) => r.p, "num"],
    ["status", "status", (r) => h("span", { class: `status ${r.status}`, text: r.status })],
    ["finish", "finish", (r) => r.finish || "-"],
    ["reward", "reward", (r) => fmt(r.reward), "num"],
    ["em", "EM", (r) => fmt(r.em, 0), "num"],
    ["fv", "format", (r) => fmt(r.fv, 0), "num"],
    ["source", "source", (r) => (r.source === null || r.source === undefined ? "-" : String(r.source))],
    ["turns", "turns", (r) => fmt(r.turns), "num"],
    ["calls", "tool calls (failed)", (r) => Object.entries(r.tools).map(([n, [c, x]]) => `${n} ${c}` + (x ? ` (${x} failed)` : "")).join(", ") || "-"],
    ["len", "response tokens", (r) => r.len, "num"],
    ["gap", "max |Δ log p|", (r) => fmt(r.gap), "num"],
    ["q", "question", (r) => r.q, "question"],
    ["answer", "answer", (r) => answerText(r.answer), "answer"],
    ["answers", "gold", (r) => (r.answers || []).join(" | ")],
  ];
  // Columns that apply to some runs only: the train/rollout log-prob gap needs a train dump.
  const APPLIES = { gap: (run) => run.train_sources.length > 0 };
  function columnsOf(run) {
    return COLUMNS.filter(([k]) => !APPLIES[k] || APPLIES[k](run));
  }
  function answerText(answer) {
    return answer === null || answer === undefined ? "(none)" : answer; // none: the model gave no answer
  }
  function sortValue(row, key) {
    if (key === "calls") return Object.values(row.tools).reduce((a, [c]) => a + c, 0);
    if (key === "answers") return (row.answers || []).join(" ");
    return row[key];
  }

  function refreshList() {
    state.limit = LIST_STEP;
    drawList();
  }

  function drawList() {
    const run = DATA.runs[state.run];
    const { key, up } = state.sort;
    const rows = run.rows.filter(passes);
    rows.sort((a, b) => {
      const x = sortValue(a, key), y = sortValue(b, key);
      const missing = (x === null || x === undefined) - (y === null || y === undefined);
      if (missing) return missing; // rows without the value last, either way
      const order = x < y ? -1 : x > y ? 1 : a.p - b.p;
      return up ? order : -order;
    });
    state.visible = rows.map((r) => r.p);
    document.getElementById("count").textContent = `${rows.length} of ${run.rows.length} samples`;
    const columns = columnsOf(run);
    const head = h("tr", null, columns.map(([k, label]) => {
      const cls = k === key ? `sorted${up ? " up" : ""}` : null;
      return h("th", { class: cls, text: label, data: { sort: k }, onclick: () => {
        state.sort = { key: k, up: state.sort.key === k ? !state.sort.up : true };
        drawList();
      } });
    }));
    const body = h("tbody");
    for (const row of rows.slice(0, state.limit)) {
      body.appendChild(h("tr", { data: { pos: row.p }, onclick: () => go(state.run, row.p) },
        columns.map(([k, , cell, cls]) => h("td", { class: cls, data: { col: k } }, [cell(row)]))));
    }
    const list = clear(document.getElementById("list"));
    list.appendChild(h("table", { class: "samples" }, [h("thead", null, [head]), body]));
    if (rows.length > state.limit) {
      list.appendChild(h("button", { class: "more", text: `show ${Math.min(LIST_STEP, rows.length - state.limit)} more`, onclick: () => {
        state.limit += LIST_STEP;
        drawList();
      } }));
    }
  }

  // ---- sample view ----------------------------------------------------------------------------------------------------
  function loadDetail(runIndex, position, then) {
    const node = document.getElementById(`d-${runIndex}-${position}`);
    if (node) return then(JSON.parse(node.textContent));
    if (document.readyState === "loading") {
      // the page is still being read: the sample's block comes further down
      document.addEventListener("DOMContentLoaded", () => loadDetail(runIndex, position, then), { once: true });
      return undefined;
    }
    return then(null);
  }

  function drawSample(position) {
    const view = clear(document.getElementById("sample-view"));
    const run = DATA.runs[state.run];
    const row = run.rows.find((r) => r.p === position);
    view.appendChild(h("p", { class: "muted", text: "loading…" }));
    loadDetail(state.run, position, (detail) => {
      clear(view);
      if (!row || !detail) {
        view.appendChild(h("div", { class: "warning", text: `Sample ${position} is not in this page.` }));
        return;
      }
      renderSample(view, run, row, detail);
      document.documentElement.dataset.sampleReady = `${state.run}-${position}`;
    });
  }

  function renderSample(view, run, row, detail) {
    const at = state.visible.indexOf(row.p);
    const step = (delta) => {
      const next = state.visible[at + delta];
      if (next !== undefined) go(state.run, next);
    };
    view.appendChild(h("div", { class: "bar" }, [
      h("button", { text: "← list", onclick: () => go(state.run, null) }),
      h("button", { text: "‹ previous", disabled: at <= 0 ? "" : null, onclick: () => step(-1) }),
      h("button", { text: "next ›", disabled: at < 0 || at >= state.visible.length - 1 ? "" : null, onclick: () => step(1) }),
      h("h2", { text: `${run.name} · sample ${row.p}` }),
    ]));
    const record = detail.record || {};
    const badges = [
      h("span", { class: `status ${row.status}`, text: row.status, data: { field: "status" } }),
      h("span", { class: "badge", text: `finish: ${record.finish_reason || "-"}`, data: { field: "finish_reason" } }),
    ];
    if (row.source !== null && row.source !== undefined) badges.push(h("span", { class: "badge", text: `source: ${row.source}` }));
    if (row.index !== null && row.index !== undefined) badges.push(h("span", { class: "badge", text: `index ${row.index}` }));
    if (row.group !== null && row.group !== undefined) badges.push(h("span", { class: "badge", text: `group ${row.group}` }));
    if (row.removed) badges.push(h("span", { class: "badge bad", text: "remove_sample: kept out of the loss" }));
    if (record.reward && record.reward.unscored) badges.push(h("span", { class: "badge bad", text: "the judge gave no verdict: unscored, kept out of training", data: { field: "unscored" } }));
    if (record.tool_error) badges.push(h("span", { class: "badge bad", text: `tool error: ${record.tool_error}` }));
    if (record.engine_error) badges.push(h("span", { class: "badge bad", text: `engine error: ${record.engine_error}` }));
    if (record.template_error) badges.push(h("span", { class: "badge bad", text: `template error: ${record.template_error}` }));
    if (record.length_refusal) badges.push(h("span", { class: "badge", text: `the engine's length limit: ${record.length_refusal}` }));
    if (row.resumes) badges.push(h("span", { class: "badge", text: `resumed ${row.resumes}× (partial rollout): ${record.earlier_policy_tokens} of ${record.generated_tokens} sampled tokens from earlier rollouts`, data: { field: "resumes" } }));
    view.appendChild(h("div", { class: "badges" }, badges));
    if (detail.versions) view.appendChild(versionBadges(detail.versions));
    view.appendChild(h("p", { class: "muted", text: `question: ${row.q}` }));

    const reward = record.reward || {};
    const scoredBy = reward.scored_by || "em";
    const rewardKeys = ["score", "em", ...(scoredBy === "em" ? [] : [scoredBy]), "format_valid", "retrieval_hit"];
    const rewardRows = rewardKeys.map((k) =>
      h("tr", null, [h("td", { text: k }), h("td", { class: "value", text: fmt(reward[k] === undefined ? null : reward[k]), data: { reward: k } })]));
    if (record.reward) rewardRows.push(h("tr", null, [h("td", { text: "scored by" }), h("td", { class: "value", text: scoredBy, data: { reward: "scored_by" } })]));
    const verdict = reward.judge_verdict;
    if (verdict) {
      const said = [verdict.status, `${verdict.attempts} request${verdict.attempts === 1 ? "" : "s"}`, verdict.error].filter((x) => x).join("; ");
      rewardRows.push(h("tr", null, [h("td", { text: "judge" }), h("td", { class: "value", text: said, data: { reward: "judge_verdict" } })]));
      if (verdict.reply) rewardRows.push(h("tr", null, [h("td", { text: "judge's reply" }), h("td", { class: "value reply", text: verdict.reply })]));
    }
    rewardRows.push(h("tr", null, [h("td", { text: "sample.reward" }), h("td", { class: "value", text: typeof detail.reward === "object" && detail.reward !== null ? JSON.stringify(detail.reward) : fmt(detail.reward) })]));
    rewardRows.push(h("tr", null, [h("td", { text: "answer" }), h("td", { class: "value", text: answerText(row.answer), data: { reward: "answer" } })]));
    rewardRows.push(h("tr", null, [h("td", { text: "gold answers" }), h("td", { class: "value", text: (detail.answers || []).join(" | ") || "-", data: { reward: "gold" } })]));
    const counted = ["turns", "invalid_actions", "observation_tokens", "truncated_observations"];
    for (const k of ["engine_aborts", "aborts_after_turn_end", "restarts", "max_version_lag", "lag_masked_tokens"]) {
      if (record[k] !== undefined && record[k] !== null && (record[k] || k === "max_version_lag")) counted.push(k); // fully-async
    }
    for (const k of ["page_chunks", "short_form_tokens_saved"]) if (record[k]) counted.push(k); // long horizon
    if (record.segments > 1) counted.push("segments");
    const counters = counted.map((k) =>
      h("tr", null, [h("td", { text: k }), h("td", { class: "value", text: fmt(record[k] === undefined ? null : record[k]), data: { counter: k } })]));
    const forced = record.forced_answer, part = record.segment;
    if (forced) counters.push(h("tr", null, [h("td", { text: "forced answer" }), h("td", { class: "value", text: `${forced.mode} on turn ${forced.turn} (${forced.trigger}), ${forced.tokens} instruction tokens`, data: { counter: "forced_answer" } })]));
    if (part) counters.push(h("tr", null, [h("td", { text: "part" }), h("td", { class: "value", text: `${part.index + 1} of ${part.count}, from response token ${part.start}`, data: { counter: "segment" } })]));
    const toolRows = Object.entries(record.tools || {}).map(([name, c]) => {
      const seconds = (c.seconds || []).map((s) => s.toFixed(2)).join(", ");
      return h("tr", null, [h("td", { text: name }), h("td", { class: "value", text: `${c.calls || 0} calls, ${c.failures || 0} failed${seconds ? `; seconds ${seconds}` : ""}` })]);
    });
    view.appendChild(h("div", { class: "cards" }, [
      h("div", { class: "card" }, [h("h3", { text: "Reward" }), h("table", null, [h("tbody", null, rewardRows)])]),
      h("div", { class: "card" }, [h("h3", { text: "Episode" }), h("table", null, [h("tbody", null, counters.concat(toolRows))])]),
    ]));

    drawToolCalls(view, detail);
    if (Array.isArray(detail.conversation)) drawConversation(view, detail);
    drawTokens(view, detail);
    for (const [key, value] of Object.entries(detail.record_more || {})) {
      view.appendChild(jsonBlock(`record: ${key}`, value, true, "record-more"));
    }
    view.appendChild(jsonBlock("the whole record (sample.metadata[\"search_r1\"])", detail.record, false, "record"));
    view.appendChild(jsonBlock("other sample fields", detail.fields, false, "fields"));
    if (Object.keys(detail.train_fields || {}).length) view.appendChild(jsonBlock("train dump: other values", detail.train_fields, false, "train-fields"));
    if (detail.label !== undefined) view.appendChild(jsonBlock("label", detail.label, false, "label"));
  }

  // ---- weight versions: which policy sampled which tokens ---------------------------------------------------------
  const VERSION_COLOURS = 6; // .v0 ... .v5 in the style sheet, oldest first, cycled
  function versionName(name) {
    return name === null || name === undefined ? "unknown" : String(name);
  }
  function versionBadges(versions) {
    const badges = [h("span", { class: "muted", text: `weight version of each engine call (${versions.spans.length}):` })];
    versions.names.forEach((name, k) => {
      const spans = versions.spans.filter((span) => span[2] === k).map(([start, end]) => `${start}–${end - 1}`);
      const lag = versions.lags[k] ? ` (${versions.lags[k]} behind)` : "";
      badges.push(h("span", { class: "badge", data: { field: "version", version: versionName(name) } }, [
        h("span", { class: `swatch v${k % VERSION_COLOURS}` }),
        `version ${versionName(name)}${lag}: tokens ${spans.join(", ")}`,
      ]));
    });
    return h("div", { class: "badges versions", data: { block: "versions" } }, badges);
  }
  function versionIndex(versions, n) {
    // per response token: the index of the version that sampled it in versions.names, -1 for the tokens none did
    const index = new Int16Array(n).fill(-1);
    for (const [start, end, k] of versions ? versions.spans : []) index.fill(k, start, Math.min(end, n));
    return index;
  }

  function jsonBlock(title, value, open, name) {
    const block = h("details", { data: { block: name } }, [h("summary", { text: title }), h("pre", { class: "json", text: pretty(value) })]);
    if (open) block.open = true;
    return block;
  }

  function drawToolCalls(view, detail) {
    const calls = detail.tool_calls || [];
    view.appendChild(h("h3", { text: `Tool calls (${calls.length})` }));
    if (!calls.length) view.appendChild(h("p", { class: "muted", text: "none" }));
    for (const call of calls) {
      const args = typeof call.arguments === "string" ? call.arguments : pretty(call.arguments);
      view.appendChild(h("div", { class: "call", data: { tool: call.name } }, [
        h("div", { class: "head", text: `turn ${call.turn} · ${call.name}` }),
        h("pre", { class: "arguments", text: args }),
        h("pre", { class: "result", text: call.result === null || call.result === undefined ? "(no result)" : String(call.result) }),
      ]));
    }
  }

  function messageNode(message) {
    const parts = [h("div", { class: "role", text: message.role + (message.name ? ` · ${message.name}` : "") })];
    if (message.content !== undefined && message.content !== null && message.content !== "") {
      parts.push(h("pre", { text: typeof message.content === "string" ? message.content : pretty(message.content) }));
    }
    for (const call of message.tool_calls || []) {
      const fn = call.function || {};
      parts.push(h("pre", { class: "tool-call", text: `→ ${fn.name}(${fn.arguments})` }));
    }
    for (const [key, value] of Object.entries(message)) {
      if (["role", "content", "tool_calls", "name", "tool_call_id"].includes(key)) continue;
      parts.push(h("pre", { class: "extra", text: `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}` }));
    }
    return h("div", { class: `message ${message.role}` }, parts);
  }

  function drawConversation(view, detail) {
    const prompt = Array.isArray(detail.prompt) ? detail.prompt : [];
    const box = h("details", { open: "", data: { block: "conversation" } }, [h("summary", { text: `Conversation (${prompt.length} prompt messages, ${detail.conversation.length} after)` })]);
    for (const message of prompt) box.appendChild(messageNode(message));
    for (const message of detail.conversation) box.appendChild(messageNode(message));
    view.appendChild(box);
  }

  // ---- tokens ---------------------------------------------------------------------------------------------------------
  function drawTokens(view, detail) {
    view.appendChild(h("h3", { text: "Turns, token by token" }));
    if (detail.response_ids === undefined) {
      view.appendChild(h("p", { class: "muted", text: "This file holds no token ids: the turns are shown as text." }));
      const prompt = typeof detail.prompt === "string" ? detail.prompt : pretty(detail.prompt);
      view.appendChild(h("details", { class: "step" }, [h("summary", { text: "prompt" }), h("pre", { class: "text", text: prompt })]));
      let turn = 0;
      for (const [kind, text] of detail.steps) {
        const label = kind === "model" ? `turn ${++turn}: written by the model` : "shown to the model";
        view.appendChild(h("div", { class: `step ${kind}` }, [h("div", { class: "head", text: label }), h("pre", { class: "text", text: text })]));
      }
      return;
    }
    const n = detail.n;
    const ids = typedArray(detail.response_ids, Int32Array, n);
    const promptIds = typedArray(detail.prompt_ids, Int32Array, 0) || new Int32Array(0);
    const mask = typedArray(detail.loss_mask, Uint8Array, n);
    const series = {};
    for (const [name, value] of Object.entries(detail.series || {})) series[name] = typedArray(value, Float32Array, n);
    const texts = HAS_VOCAB ? tokenTexts(ids) : null;
    const tokens = { ids, mask, series, texts, promptIds, promptTexts: null, earlierBefore: detail.earlier_before || 0 };
    tokens.versions = detail.versions;
    tokens.version = versionIndex(detail.versions, n);
    tokens.colourVersions = Boolean(detail.versions && detail.versions.names.length > 1); // one version: no marks

    // the gap marks need the train side's log probs: without a train dump (an evaluation) there is no control
    const hasGap = Boolean(series.log_probs && series.rollout_log_probs);
    const thresholdInput = hasGap ? h("input", { type: "number", step: "any", min: "0", value: String(state.threshold), name: "threshold" }) : null;
    view.appendChild(h("div", { class: "legend" }, [
      h("span", null, [h("span", { class: "swatch", style: "background: var(--trained)" }), "trained (loss mask 1)"]),
      h("span", null, [h("span", { class: "swatch", style: "background: var(--shown)" }), "shown to the model (loss mask 0)"]),
      h("span", null, [h("span", { class: "swatch", style: "background: #fff" }), "prompt"]),
      hasGap ? h("span", { data: { control: "gap" } }, [h("span", { class: "swatch", style: "outline: 2px solid var(--gap)" }), "|train − rollout log prob| >", thresholdInput]) : null,
      tokens.earlierBefore ? h("span", null, [h("span", { class: "swatch earlier" }), "sampled in an earlier rollout (partial rollout)"]) : null,
      ...(tokens.colourVersions
        ? detail.versions.names.map((name, k) => h("span", null, [h("span", { class: `swatch v${k % VERSION_COLOURS}` }), `weight version ${versionName(name)}`]))
        : []),
    ]));
    if (!HAS_VOCAB) view.appendChild(h("div", { class: "note", text: "No tokenizer was given (--tokenizer): tokens are shown by id." }));

    const inspector = h("div", { class: "inspector", data: { block: "inspector" } }, [h("p", { class: "hint", text: "Hover a token to see its values; click to pin it." })]);
    const column = h("div", { class: "tokens-column" });
    const promptBox = h("details", { class: "step prompt", data: { block: "prompt" } }, [h("summary", { text: `prompt: ${promptIds.length} tokens shown to the model` })]);
    promptBox.addEventListener("toggle", () => {
      if (!promptBox.open || promptBox.querySelector(".tokens")) return;
      tokens.promptTexts = HAS_VOCAB ? tokenTexts(promptIds) : null;
      const holder = h("div", { class: "tokens" });
      appendSpans(holder, tokens, 0, promptIds.length, true);
      promptBox.appendChild(holder);
    });
    column.appendChild(promptBox);
    let turn = 0;
    for (const [kind, start, end] of detail.steps) {
      const label = kind === "model"
        ? `turn ${++turn}: written by the model, ${end - start} tokens, trained`
        : `shown to the model: ${end - start} tokens, not trained`;
      const holder = h("div", { class: "tokens", data: { step: kind } });
      appendSpans(holder, tokens, start, end, false);
      column.appendChild(h("div", { class: `step ${kind}` }, [h("div", { class: "head", text: label }), holder]));
    }
    if (!HAS_VOCAB) {
      column.appendChild(h("details", { class: "step" }, [h("summary", { text: "response text" }), h("pre", { class: "text", text: detail.response })]));
    }
    view.appendChild(h("div", { class: "tokens-layout" }, [column, inspector]));

    let pinned = null;
    const show = (span) => drawInspector(inspector, tokens, span);
    column.addEventListener("mouseover", (e) => {
      const span = e.target.closest(".t");
      if (span && !pinned) show(span);
    });
    column.addEventListener("click", (e) => {
      const span = e.target.closest(".t");
      if (!span) return;
      if (pinned) pinned.classList.remove("selected");
      pinned = pinned === span ? null : span;
      if (pinned) pinned.classList.add("selected");
      show(span);
    });
    const markGaps = () => {
      if (!hasGap) return;
      const limit = Number(thresholdInput.value);
      state.threshold = limit;
      column.querySelectorAll(".t[data-i]").forEach((span) => {
        const i = Number(span.dataset.i);
        const over = mask[i] === 1 && Math.abs(series.log_probs[i] - series.rollout_log_probs[i]) > limit;
        span.classList.toggle("gap", over);
      });
    };
    if (hasGap) thresholdInput.addEventListener("input", markGaps);
    markGaps();
  }

  function appendSpans(holder, tokens, start, end, isPrompt) {
    const fragment = document.createDocumentFragment();
    const ids = isPrompt ? tokens.promptIds : tokens.ids;
    const texts = isPrompt ? tokens.promptTexts : tokens.texts;
    for (let i = start; i < end; i++) {
      const span = document.createElement("span");
      const text = texts ? texts[i] : null;
      let cls = isPrompt ? "t pr" : tokens.mask && tokens.mask[i] === 0 ? "t m0" : "t m1";
      if (SPECIAL.has(ids[i])) cls += " sp";
      if (!isPrompt && i < tokens.earlierBefore) cls += " earlier";
      if (!isPrompt && tokens.colourVersions && tokens.version[i] >= 0) cls += ` v${tokens.version[i] % VERSION_COLOURS}`;
      if (text === null) {
        cls += " noid";
        span.textContent = `[${ids[i]}]`;
      } else {
        if (text === "") cls += " part";
        if (text.includes("\n") && !text.trim()) cls += " nl"; // a line break alone gets a mark to hover
        span.textContent = text;
      }
      span.className = cls;
      if (isPrompt) span.dataset.p = i;
      else span.dataset.i = i;
      fragment.appendChild(span);
    }
    holder.appendChild(fragment);
  }

  function drawInspector(box, tokens, span) {
    const isPrompt = span.dataset.p !== undefined;
    const i = Number(isPrompt ? span.dataset.p : span.dataset.i);
    const ids = isPrompt ? tokens.promptIds : tokens.ids;
    const texts = isPrompt ? tokens.promptTexts : tokens.texts;
    const rows = [];
    const add = (label, field, value, shown) => rows.push(h("tr", null, [
      h("td", { text: label }),
      h("td", { class: "value", text: shown === undefined ? fmt(value, 4) : shown, data: { field: field, value: String(value) } }),
    ]));
    add("token", "position", i, `${isPrompt ? "prompt" : "response"} token ${i} of ${ids.length}`);
    add("id", "id", ids[i], String(ids[i]));
    add("text", "text", texts ? texts[i] : "", texts ? JSON.stringify(texts[i]) : "(no tokenizer)");
    if (SPECIAL.has(ids[i])) add("special token", "special", 1, "yes");
    if (!isPrompt) {
      const m = tokens.mask ? tokens.mask[i] : null;
      add("loss mask", "loss_mask", m, m === 1 ? "1: trained" : m === 0 ? "0: shown to the model, not trained" : "-");
      if (tokens.versions) {
        const k = tokens.version[i];
        const name = k >= 0 ? versionName(tokens.versions.names[k]) : "";
        const lag = k >= 0 && tokens.versions.lags[k] ? ` (${tokens.versions.lags[k]} behind this sample's newest)` : "";
        add("weight version", "version", name, k >= 0 ? name + lag : "- (not sampled: shown to the model)");
      }
      if (tokens.earlierBefore) {
        const earlier = i < tokens.earlierBefore;
        add("rollout", "earlier", earlier ? 1 : 0, earlier ? "an earlier one (before the last resume)" : "this one");
      }
      for (const [name, values] of Object.entries(tokens.series)) {
        const value = values[i];
        const extra = name.endsWith("log_probs") ? ` (p = ${Math.exp(value).toFixed(4)})` : "";
        add(SERIES_LABELS[name] || name, name, value, `${fmt(value, 4)}${extra}`);
      }
      if (tokens.series.log_probs && tokens.series.rollout_log_probs) {
        const gap = tokens.series.log_probs[i] - tokens.series.rollout_log_probs[i];
        add("train − rollout", "gap", gap, fmt(gap, 4));
      }
    }
    clear(box).appendChild(h("table", null, [h("tbody", null, rows)]));
  }

  // ---- navigation: #run=R&sample=P ----------------------------------------------------------------------------------
  function go(runIndex, position) {
    const hash = position === null ? `#run=${runIndex}` : `#run=${runIndex}&sample=${position}`;
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  function route() {
    const params = new URLSearchParams(location.hash.slice(1));
    const runIndex = Math.min(Math.max(Number(params.get("run")) || 0, 0), Math.max(DATA.runs.length - 1, 0));
    if (!DATA.runs.length) return;
    const changedRun = runIndex !== state.run || !document.getElementById("list").firstChild;
    state.run = runIndex;
    if (changedRun) drawRun();
    const sample = params.get("sample");
    const runView = document.getElementById("run-view");
    const sampleView = document.getElementById("sample-view");
    if (sample === null) {
      runView.hidden = false;
      sampleView.hidden = true;
      delete document.documentElement.dataset.sampleReady;
      return;
    }
    runView.hidden = true;
    sampleView.hidden = false;
    delete document.documentElement.dataset.sampleReady;
    drawSample(Number(sample));
    window.scrollTo(0, 0);
  }

  document.addEventListener("keydown", (e) => {
    if (document.getElementById("sample-view").hidden || e.target.closest("input, select, textarea")) return;
    const buttons = document.querySelectorAll("#sample-view .bar button");
    if (e.key === "ArrowLeft" && buttons[1]) buttons[1].click();
    if (e.key === "ArrowRight" && buttons[2]) buttons[2].click();
    if (e.key === "Escape" && buttons[0]) buttons[0].click();
  });
  window.addEventListener("hashchange", route);
  drawFrame();
  route();
  document.documentElement.dataset.ready = "1";
  performance.mark("viewer-ready");
})();
