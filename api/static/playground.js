// dllm-serve playground: sends the conversation to the server's own POST /v1/chat/completions with
// `stream: true` and draws the canvas from each step chunk's `diffusion` object.
//
// The live view applies one step per animation frame, so every intermediate canvas is painted even when
// several steps arrive in one network read; the clock and the rates use the arrival times, not the paint.
// The form is built from /playground/settings.json (the request schema's ranges, the engine's defaults):
// no default or limit is written here.
"use strict";

const byId = (id) => document.getElementById(id);
const el = {
  model: byId("model"),
  controls: byId("controls"),
  system: byId("system"),
  apiKey: byId("api-key"),
  reset: byId("reset"),
  transcript: byId("transcript"),
  error: byId("error"),
  composer: byId("composer"),
  prompt: byId("prompt"),
  send: byId("send"),
  stop: byId("stop"),
  newChat: byId("new-chat"),
  status: byId("status"),
  canvas: byId("canvas"),
  legendSteps: byId("legend-steps"),
  timeline: byId("timeline"),
  replay: byId("replay"),
  scrub: byId("scrub"),
  scrubLabel: byId("scrub-label"),
  speed: byId("speed"),
  requestJson: byId("request-json"),
  finalJson: byId("final-json"),
  reuseSeed: byId("reuse-seed"),
  theme: byId("theme"),
  stats: {
    step: byId("stat-step"),
    passes: byId("stat-passes"),
    committed: byId("stat-committed"),
    masked: byId("stat-masked"),
    elapsed: byId("stat-elapsed"),
    rate: byId("stat-rate"),
    answer: byId("stat-answer"),
  },
};

const page = {
  settings: null,
  stopTokenIds: new Set(),
  history: [], // finished turns: {role, content}
  run: null, // the current or last run (see newRun)
  controller: null, // aborts the request in flight
  replayTimer: null,
};

// --- JSON with 64-bit integers ----------------------------------------------------------------------------
// Seeds go up to 2^64 − 1, beyond a JS number's exact range: parse such integers as BigInt (from the source
// text) and write BigInts back as raw JSON, where the browser supports it.

function parseJson(text) {
  return JSON.parse(text, (key, value, context) =>
    typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)
      ? BigInt(context.source)
      : value,
  );
}

function toJson(value, indent) {
  return JSON.stringify(
    value,
    (key, v) => (typeof v === "bigint" ? (JSON.rawJSON ? JSON.rawJSON(v.toString()) : Number(v)) : v),
    indent,
  );
}

// --- the settings form --------------------------------------------------------------------------------------

async function loadSettings() {
  el.model.textContent = "loading the model's settings…";
  let response;
  try {
    response = await fetch("/playground/settings.json", { headers: { Accept: "application/json" } });
  } catch (error) {
    showError({ message: `Could not reach the server: ${error.message}` }, loadSettings);
    return;
  }
  if (!response.ok) {
    showError(await apiError(response), loadSettings);
    el.model.textContent = "the model's settings are not available";
    return;
  }
  const settings = parseJson(await response.text());
  page.settings = settings;
  page.stopTokenIds = new Set(settings.stop_tokens.map((t) => t.token_id));
  el.model.textContent =
    `${settings.model} · ${settings.family} family · up to ${settings.max_sequence_length} tokens ` +
    "(prompt + canvas)";
  buildForm(settings.groups);
  clearError();
  el.send.disabled = false;
}

function buildForm(groups) {
  el.controls.replaceChildren();
  for (const group of groups) {
    const fieldset = document.createElement("fieldset");
    const legend = document.createElement("legend");
    legend.textContent = group.title;
    fieldset.append(legend);
    for (const spec of group.controls) fieldset.append(buildControl(spec));
    el.controls.append(fieldset);
  }
  updateDependentControls();
}

function buildControl(spec) {
  const label = document.createElement("label");
  label.className = "control";
  label.dataset.control = spec.name;
  const id = `field-${spec.name}`;
  label.htmlFor = id;
  const name = document.createElement("span");
  name.className = "name";
  // Long field names break after their underscores, not mid-word.
  spec.name.split("_").forEach((part, index, parts) => {
    name.append(index < parts.length - 1 ? `${part}_` : part);
    if (index < parts.length - 1) name.append(document.createElement("wbr"));
  });

  let input;
  if (spec.type === "enum") {
    input = document.createElement("select");
    const omitted = new Option(`default: ${spec.default ?? "server's"}`, "");
    input.append(omitted, ...spec.enum.map((choice) => new Option(choice, choice)));
  } else if (spec.type === "boolean") {
    input = document.createElement("input");
    input.type = "checkbox";
    input.checked = spec.default === true;
  } else {
    input = document.createElement("input");
    const exact =
      spec.type !== "integer" || [spec.minimum, spec.maximum].every((b) => b === undefined || Number.isSafeInteger(b));
    if (exact) {
      input.type = "number";
      input.step = spec.type === "integer" ? "1" : "0.05";
      for (const bound of ["minimum", "maximum"]) {
        if (spec[bound] !== undefined) input[bound === "minimum" ? "min" : "max"] = String(spec[bound]);
      }
      if (spec.exclusiveMinimum !== undefined) input.min = String(spec.exclusiveMinimum);
    } else {
      // A 64-bit range (the seed): a number input would round it.
      input.type = "text";
      input.inputMode = "numeric";
      input.spellcheck = false;
    }
    input.placeholder =
      spec.default !== null && spec.default !== undefined ? String(spec.default) : (spec.default_note ?? "");
  }
  input.id = id;
  input.name = spec.name;
  input.dataset.testid = spec.name;
  input.dataset.type = spec.type;
  if (spec.requires) input.dataset.requires = spec.requires;

  const help = document.createElement("span");
  help.className = "help";
  help.id = `${id}-help`;
  help.textContent = describeRange(spec) + stripMarkdown(spec.description);
  input.setAttribute("aria-describedby", help.id);
  label.append(name, input, help);
  return label;
}

function describeRange(spec) {
  const parts = [];
  if (spec.minimum !== undefined) parts.push(`≥ ${spec.minimum}`);
  if (spec.exclusiveMinimum !== undefined) parts.push(`> ${spec.exclusiveMinimum}`);
  if (spec.maximum !== undefined) parts.push(`≤ ${spec.maximum}`);
  return parts.length ? `${parts.join(", ")}. ` : "";
}

function stripMarkdown(text) {
  return text.replace(/\*\*|`/g, "");
}

function formInputs() {
  return [...el.controls.querySelectorAll("input, select")];
}

// A setting that needs another is enabled once that one is on: a switch checked, or any other field filled in
// (max_post_steps needs editing_threshold).
function updateDependentControls() {
  for (const input of formInputs()) {
    if (!input.dataset.requires) continue;
    const required = el.controls.querySelector(`[name="${input.dataset.requires}"]`);
    const on = required !== null && (required.type === "checkbox" ? required.checked : required.value.trim() !== "");
    input.disabled = !on;
    input.closest(".control").classList.toggle("off", !on);
  }
}

// The request fields the form sets; empty fields are left out (the server's default applies).
function formFields() {
  const fields = {};
  const problems = [];
  for (const input of formInputs()) {
    if (input.disabled) continue;
    const type = input.dataset.type;
    if (type === "boolean") {
      if (input.checked) fields[input.name] = true;
      continue;
    }
    if (input.validity.badInput) {
      problems.push(`${input.name}: not a number`);
      continue;
    }
    const raw = input.value.trim();
    if (raw === "") continue;
    if (type === "integer" && /^-?\d+$/.test(raw)) {
      fields[input.name] = Number.isSafeInteger(Number(raw)) ? Number(raw) : BigInt(raw);
    } else if (type === "number" && Number.isFinite(Number(raw))) {
      fields[input.name] = Number(raw);
    } else {
      fields[input.name] = raw; // sent as typed: the API says what is wrong with it
    }
  }
  return { fields, problems };
}

function resetForm() {
  for (const input of formInputs()) {
    if (input.type === "checkbox") input.checked = false;
    else input.value = "";
  }
  updateDependentControls();
}

// --- errors ---------------------------------------------------------------------------------------------------

async function apiError(response) {
  const text = await response.text();
  try {
    const body = parseJson(text);
    if (body && body.error && typeof body.error.message === "string") return { ...body.error, status: response.status };
  } catch {
    // not JSON: shown as text below
  }
  return {
    message: `HTTP ${response.status} ${response.statusText}: ${text.slice(0, 500) || "(empty body)"}`,
    status: response.status,
  };
}

function showError(error, retry) {
  el.error.replaceChildren();
  const message = document.createElement("span");
  message.className = "message";
  message.textContent = error.message;
  el.error.append(message);
  const detail = [error.status && `HTTP ${error.status}`, error.code, error.param && `param: ${error.param}`].filter(
    Boolean,
  );
  if (detail.length) {
    const small = document.createElement("span");
    small.className = "detail";
    small.textContent = detail.join(" · ");
    el.error.append(small);
  }
  if (retry) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "quiet";
    button.textContent = "Retry";
    button.addEventListener("click", retry);
    el.error.append(" ", button);
  }
  el.error.hidden = false;
}

function clearError() {
  el.error.hidden = true;
  el.error.replaceChildren();
}

function setStatus(state, text) {
  el.status.dataset.state = state;
  el.status.textContent = text;
}

// --- a run: request, stream, live view ------------------------------------------------------------------

// A field's default as the form shows it (the engine's, for the loaded model).
function settingDefault(name) {
  for (const group of page.settings.groups) for (const c of group.controls) if (c.name === name) return c.default;
  return undefined;
}

function newRun(blockLength, maxTokens) {
  return {
    blockLength, // from the form; the resolved one replaces it at the end
    // The answer's length: a block-diffusion canvas is rounded up to whole blocks, and the positions past the
    // answer are denoised too (their commits are not drawn), so it cannot be read off the first step.
    canvasSize: page.settings.aligned_blocks && maxTokens ? maxTokens : null,
    firstBlock: undefined, // aligned blocks: the first block's answer positions, once the prompt length is known
    cells: [],
    blocks: [],
    steps: [], // step chunks' `diffusion` objects, plus `delta` (text) and `at` (ms since send)
    applied: 0, // steps painted so far
    answer: "",
    finish: null, // {finish_reason, diffusion}
    usage: null,
    streamDone: false,
    startedAt: performance.now(),
    answerEl: null,
  };
}

async function send() {
  if (page.controller || !page.settings) return;
  stopReplay();
  const text = el.prompt.value;
  if (!text.trim()) {
    showError({ message: "Type a message first." });
    el.prompt.focus();
    return;
  }
  const { fields, problems } = formFields();
  if (problems.length) {
    showError({ message: `Fix the settings first: ${problems.join("; ")}.` });
    return;
  }
  clearError();
  const userTurn = { role: "user", content: text };
  const system = el.system.value.trim() ? [{ role: "system", content: el.system.value }] : [];
  const body = {
    messages: [...system, ...page.history, userTurn],
    ...fields,
    stream: true,
    stream_options: { include_usage: true },
  };
  const run = newRun(fields.block_length, fields.max_tokens ?? settingDefault("max_tokens"));
  page.run = run;
  el.canvas.replaceChildren();
  el.timeline.replaceChildren();
  showStepStats(run, 0);
  el.requestJson.textContent = toJson(body, 2);
  el.finalJson.textContent = "";
  el.reuseSeed.disabled = true;

  const userEl = appendTurn("user", text);
  run.answerEl = appendTurn("assistant", "");
  run.answerEl.classList.add("live");
  el.prompt.value = "";
  setRunning(true);
  setStatus("running", "waiting for the first step…");

  const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
  if (el.apiKey.value) headers.Authorization = `Bearer ${el.apiKey.value}`;
  page.controller = new AbortController();
  let failure = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers,
      body: toJson(body),
      signal: page.controller.signal,
    });
    if (!response.ok) failure = await apiError(response);
    else failure = await readStream(response, run);
  } catch (error) {
    failure =
      error.name === "AbortError"
        ? {
            message: "Stopped: the request was cancelled (the server frees its slot at the next step).",
            cancelled: true,
          }
        : { message: `Could not reach the server: ${error.message}` };
  }
  page.controller = null;
  run.streamDone = true;

  if (failure) {
    // The turn did not happen: take it back, and give the text back to fix and resend.
    userEl.remove();
    run.answerEl.remove();
    el.prompt.value = text;
    showError(failure);
    setStatus(failure.cancelled ? "cancelled" : "error", failure.cancelled ? "stopped" : "the request failed");
    setRunning(false);
    // A run stopped part-way keeps its canvas, and can be replayed as far as it went.
    await painted(run);
    if (page.run === run && !page.controller) enableReplay(run);
    return;
  }
  await painted(run);
  finishRun(run, userTurn);
}

// Server-sent events: `data: <json>` blocks separated by a blank line, ending with `data: [DONE]`.
async function readStream(response, run) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) !== -1) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return null;
      const chunk = parseJson(data);
      if (chunk.error) return { ...chunk.error, message: chunk.error.message ?? "The server reported an error." };
      receive(chunk, run);
    }
  }
  return { message: "The stream ended before [DONE]: the server closed the connection." };
}

function receive(chunk, run) {
  const at = performance.now() - run.startedAt; // arrival, not paint: the clock the stats show
  const choice = chunk.choices && chunk.choices[0];
  if (chunk.usage) run.usage = chunk.usage;
  if (!chunk.diffusion) return; // the role chunk, the usage chunk
  if (choice && choice.finish_reason) {
    run.finish = { finish_reason: choice.finish_reason, diffusion: chunk.diffusion };
    return;
  }
  if (run.cells.length === 0) {
    run.canvasSize ??= chunk.diffusion.masked_remaining + chunk.diffusion.committed.length;
    drawCanvas(run, page.settings.aligned_blocks ? run.canvasSize : (run.blockLength ?? run.canvasSize));
  }
  run.steps.push({ ...chunk.diffusion, delta: (choice && choice.delta.content) || "", at });
  schedulePaint(run);
}

// One step per frame: the newest arrivals wait their turn, so none is skipped on screen.
function schedulePaint(run) {
  if (run.painting) return;
  run.painting = true;
  const frame = () => {
    const superseded = page.run !== run; // a newer run owns the canvas now
    if (!superseded && run.applied < run.steps.length) {
      const step = run.steps[run.applied];
      applyStep(run, step);
      run.applied += 1;
      showStepStats(run, run.applied);
      if (page.controller)
        setStatus("running", `denoising: step ${step.step}, ${plural(step.masked_remaining, "position")} still masked`);
    }
    if (!superseded && run.applied < run.steps.length) requestAnimationFrame(frame);
    else {
      run.painting = false;
      if (run.onPainted) run.onPainted();
    }
  };
  requestAnimationFrame(frame);
}

function painted(run) {
  if (!run.painting) return Promise.resolve();
  return new Promise((resolve) => {
    run.onPainted = resolve;
  });
}

function finishRun(run, userTurn) {
  setRunning(false);
  run.answerEl.classList.remove("live");
  page.history.push(userTurn, { role: "assistant", content: run.answer });
  const resolved = run.finish ? run.finish.diffusion : null;
  if (resolved && run.canvasSize !== null && page.settings.aligned_blocks && run.usage) {
    // Block diffusion: blocks are aligned to position 0 of the prompt, so the first one holds the prompt's end
    // and only what is left of it belongs to the answer.
    run.blockLength = resolved.block_length;
    run.firstBlock = run.blockLength - (run.usage.prompt_tokens % run.blockLength);
    drawCanvas(run, run.blockLength);
  } else if (resolved && run.canvasSize !== null && resolved.block_length !== run.blockLength) {
    run.blockLength = resolved.block_length;
    drawCanvas(run, run.blockLength);
  }
  renderAt(run, run.steps.length);
  el.finalJson.textContent = resolved ? toJson({ finish_reason: run.finish.finish_reason, ...resolved }, 2) : "";
  el.reuseSeed.disabled = !resolved;
  enableReplay(run);
  const passes = resolved ? resolved.num_forward_passes : run.steps.length;
  const seconds = (run.steps.length ? run.steps[run.steps.length - 1].at : 0) / 1000;
  setStatus(
    "done",
    `done: ${passes} forward passes in ${seconds.toFixed(2)} s, finish_reason "${run.finish?.finish_reason}"`,
  );
}

function enableReplay(run) {
  el.scrub.max = String(run.steps.length);
  el.scrub.value = String(run.steps.length);
  el.scrub.disabled = el.replay.disabled = run.steps.length === 0;
  updateScrubLabel(run);
}

function setRunning(running) {
  el.send.disabled = running || !page.settings;
  el.stop.hidden = !running;
  el.newChat.disabled = running;
  el.replay.disabled = el.scrub.disabled = running || !page.run || page.run.steps.length === 0;
}

function appendTurn(role, text) {
  const item = document.createElement("li");
  item.className = role;
  item.textContent = text;
  if (role === "assistant") {
    for (const previous of el.transcript.querySelectorAll('[data-testid="answer"]')) delete previous.dataset.testid;
    item.dataset.testid = "answer";
  }
  el.transcript.append(item);
  el.transcript.scrollTop = el.transcript.scrollHeight;
  return item;
}

// --- drawing the canvas -------------------------------------------------------------------------------------

function drawCanvas(run, blockLength) {
  el.canvas.replaceChildren();
  run.cells = [];
  run.blocks = [];
  const size = run.canvasSize;
  let start = 0;
  for (const perBlock of blockSizes(size, blockLength, run.firstBlock)) {
    const block = document.createElement("div");
    block.className = "block";
    const label = document.createElement("div");
    label.className = "block-label";
    label.textContent = `block ${run.blocks.length} · positions ${start}–${start + perBlock - 1}`;
    const cells = document.createElement("div");
    cells.className = "cells";
    // Aligned blocks: every row as wide as a whole block, so that a short first or last block still lines up.
    cells.style.setProperty("--columns", String(columnsFor(run.firstBlock === undefined ? perBlock : blockLength)));
    for (let position = start; position < start + perBlock; position++) {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.testid = "cell";
      cell.dataset.position = String(position);
      cells.append(cell);
      run.cells.push(cell);
    }
    block.append(label, cells);
    el.canvas.append(block);
    run.blocks.push(block);
    start += perBlock;
  }
  for (const cell of run.cells) maskCell(cell);
  el.canvas.style.setProperty("--steps", "1");
}

// The sizes of the canvas's blocks: whole blocks (or one block, if they do not divide the canvas); with aligned
// blocks, a first block of `firstBlock` answer positions, then whole ones, the last cut at the canvas's end.
function blockSizes(size, blockLength, firstBlock) {
  if (!(blockLength > 0)) return [size];
  if (firstBlock === undefined) return size % blockLength === 0 ? Array(size / blockLength).fill(blockLength) : [size];
  const sizes = [];
  for (let start = 0; start < size; start += sizes[sizes.length - 1]) {
    sizes.push(Math.min(start === 0 ? firstBlock : blockLength, size - start));
  }
  return sizes;
}

// A row holds a whole divisor of the block (16 of 32, 64, 128…), so that rows line up and read as blocks.
function columnsFor(blockLength) {
  for (let columns = 16; columns >= 8; columns--) if (blockLength % columns === 0) return columns;
  return Math.min(blockLength, 16);
}

function maskCell(cell) {
  cell.dataset.state = "masked";
  delete cell.dataset.step;
  delete cell.dataset.edits;
  cell.classList.remove("eos", "tail", "edited", "flash");
  cell.textContent = "";
  cell.title = `position ${cell.dataset.position}: masked`;
  cell.style.removeProperty("--step");
}

function commitCell(cell, token, step) {
  const eos = page.stopTokenIds.has(token.token_id);
  cell.dataset.state = "committed";
  cell.dataset.step = String(step);
  cell.dataset.tokenId = String(token.token_id);
  cell.classList.toggle("eos", eos);
  cell.textContent = eos ? "EOS" : visible(token.text);
  cell.title = `position ${token.position}: ${JSON.stringify(token.text)} (token ${token.token_id}), step ${step}`;
  cell.style.setProperty("--step", String(step));
}

// LLaDA2.1's token editing overwrote a written token: the cell shows the new one, keeps a mark (and how many
// times it changed), and flashes when it happens live.
function editCell(cell, token, step, live) {
  const before = cell.textContent;
  const edits = Number(cell.dataset.edits || 0) + 1;
  commitCell(cell, token, step);
  cell.dataset.edits = String(edits);
  cell.classList.add("edited");
  cell.title += `; edited ${edits === 1 ? "once" : `${edits} times`} (was ${JSON.stringify(before)})`;
  if (live) {
    cell.classList.remove("flash");
    void cell.offsetWidth; // restart the animation when a cell is edited again
    cell.classList.add("flash");
  }
}

// Whitespace tokens would be invisible cells.
function visible(text) {
  return text.replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/^ $/, "␣") || "∅";
}

function applyStep(run, step) {
  for (const token of step.committed) {
    const cell = run.cells[token.position];
    if (cell) commitCell(cell, token, step.step);
  }
  for (const token of step.edited || []) {
    const cell = run.cells[token.position];
    if (cell) editCell(cell, token, step.step, true);
  }
  el.canvas.style.setProperty("--steps", String(step.step + 1));
  run.blocks.forEach((block, index) => block.classList.toggle("current", index === step.block));
  run.answer += step.delta;
  run.answerEl.textContent = run.answer;
  addBar(run, step);
}

function addBar(run, step) {
  const bar = document.createElement("div");
  const count = step.committed.length;
  bar.className = count ? "bar" : "bar empty";
  bar.style.setProperty("--step", String(step.step));
  bar.dataset.count = String(count);
  const edits = (step.edited || []).length;
  bar.title =
    `step ${step.step}: ${plural(count, "token")} committed` +
    (edits ? `, ${plural(edits, "token")} edited` : "") +
    `, block ${step.block}`;
  el.timeline.append(bar);
  el.timeline.style.setProperty("--steps", String(step.step + 1));
  scaleBars();
}

function scaleBars() {
  const bars = [...el.timeline.children];
  const most = Math.max(1, ...bars.map((bar) => Number(bar.dataset.count)));
  for (const bar of bars) bar.style.height = `${(100 * Number(bar.dataset.count)) / most}%`;
}

// The canvas after the first `count` steps (the replay and the scrubber), from the recorded chunks.
function renderAt(run, count) {
  for (const cell of run.cells) maskCell(cell);
  let answer = "";
  for (const step of run.steps.slice(0, count)) {
    for (const token of step.committed) {
      const cell = run.cells[token.position];
      if (cell) commitCell(cell, token, step.step);
    }
    for (const token of step.edited || []) {
      const cell = run.cells[token.position];
      if (cell) editCell(cell, token, step.step, false);
    }
    answer += step.delta;
  }
  const total = run.steps.length;
  el.canvas.style.setProperty("--steps", String(Math.max(total, 1)));
  el.timeline.style.setProperty("--steps", String(Math.max(total, 1)));
  [...el.timeline.children].forEach((bar, index) => bar.classList.toggle("future", index >= count));
  const current = count > 0 ? run.steps[count - 1].block : -1;
  run.blocks.forEach((block, index) => block.classList.toggle("current", index === current && count < total));
  if (count === total) markTail(run);
  run.answerEl.textContent = answer;
  showStepStats(run, count);
}

// Everything after the first end-of-text token is cut from the answer; positions an early exit left
// masked there were never needed.
function markTail(run) {
  const firstEos = run.cells.findIndex((cell) => cell.classList.contains("eos"));
  if (firstEos === -1) return;
  for (const cell of run.cells.slice(firstEos + 1)) cell.classList.add("tail");
}

function showStepStats(run, count) {
  const s = el.stats;
  if (count === 0) {
    s.step.textContent = "before step 0";
    s.passes.textContent = "0";
    s.committed.textContent = "–";
    s.masked.textContent = String(run.canvasSize ?? "–");
    s.elapsed.textContent = s.rate.textContent = s.answer.textContent = "–";
    return;
  }
  const step = run.steps[count - 1];
  s.step.textContent = `${step.step} (block ${step.block})`;
  s.passes.textContent = String(count);
  s.committed.textContent = String(step.committed.length);
  s.masked.textContent = String(step.masked_remaining);
  s.elapsed.textContent = `${(step.at / 1000).toFixed(2)} s`;
  const committed = run.canvasSize - step.masked_remaining;
  s.rate.textContent = step.at > 0 ? (committed / (step.at / 1000)).toFixed(1) : "–";
  const done = count === run.steps.length && run.streamDone;
  s.answer.textContent =
    done && run.usage ? `${plural(run.usage.completion_tokens, "token")}, ${run.finish?.finish_reason ?? "?"}` : "–";
  el.legendSteps.textContent = `step 0 → ${step.step}`;
}

function plural(count, noun) {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

// --- replay ----------------------------------------------------------------------------------------------

function updateScrubLabel(run) {
  el.scrubLabel.textContent = run ? `${el.scrub.value} / ${run.steps.length} steps` : "–";
}

function scrubTo(count) {
  const run = page.run;
  if (!run || page.controller) return;
  el.scrub.value = String(count);
  renderAt(run, count);
  updateScrubLabel(run);
}

function toggleReplay() {
  if (page.replayTimer) {
    stopReplay();
    return;
  }
  const run = page.run;
  if (!run || page.controller || run.steps.length === 0) return;
  let count = Number(el.scrub.value) >= run.steps.length ? 0 : Number(el.scrub.value);
  scrubTo(count);
  el.replay.textContent = "⏸ Pause";
  const tick = () => {
    count += 1;
    scrubTo(count);
    if (count >= run.steps.length) stopReplay();
    else page.replayTimer = setTimeout(tick, 1000 / Number(el.speed.value));
  };
  page.replayTimer = setTimeout(tick, 1000 / Number(el.speed.value));
}

function stopReplay() {
  clearTimeout(page.replayTimer);
  page.replayTimer = null;
  el.replay.textContent = "▶ Replay";
}

// --- wiring -------------------------------------------------------------------------------------------------

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

function toggleTheme() {
  const dark =
    document.documentElement.dataset.theme === "dark" ||
    (!document.documentElement.dataset.theme && matchMedia("(prefers-color-scheme: dark)").matches);
  const theme = dark ? "light" : "dark";
  applyTheme(theme);
  try {
    localStorage.setItem("dllm-playground-theme", theme);
  } catch {
    // storage disabled: the choice lasts for this page
  }
}

function wire() {
  try {
    applyTheme(localStorage.getItem("dllm-playground-theme"));
  } catch {
    // storage disabled
  }
  el.theme.addEventListener("click", toggleTheme);
  el.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  el.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && page.controller) page.controller.abort();
  });
  el.stop.addEventListener("click", () => page.controller && page.controller.abort());
  el.newChat.addEventListener("click", () => {
    page.history = [];
    el.transcript.replaceChildren();
    clearError();
    el.prompt.focus();
  });
  el.controls.addEventListener("change", updateDependentControls);
  el.reset.addEventListener("click", resetForm);
  el.replay.addEventListener("click", toggleReplay);
  el.scrub.addEventListener("input", () => {
    stopReplay();
    scrubTo(Number(el.scrub.value));
  });
  el.reuseSeed.addEventListener("click", () => {
    const seed = page.run && page.run.finish && page.run.finish.diffusion.seed;
    const input = el.controls.querySelector('[name="seed"]');
    if (seed !== undefined && input) input.value = String(seed);
  });
  loadSettings();
  el.prompt.focus();
}

wire();
