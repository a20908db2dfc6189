// The work strip. Everything a job printed is put in the page as text (textContent),
// never as markup; colours become classes and CSSOM styles.
'use strict';

const PAGE_ROWS = 200;
const EARLIER_BYTES = 64 * 1024;
const MAX_LINES = 5000;

const view = {
  items: [],
  // Running work and the runs that failed in the last hour: what a person most wants
  // to see.
  filter: 'now',
  limit: PAGE_ROWS,
  selected: null, // {session, id}
  rows: new Map(), // the row elements shown, by item
  follow: null, // what streams the selected item
  loading: false,
  again: false,
};

const $ = (id) => document.getElementById(id);

// An element with attributes and children (strings become text nodes).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  const text = await response.text();
  let data;
  try { data = JSON.parse(text); } catch (_) { data = { error: { message: text.trim() } }; }
  if (!response.ok || data.error) {
    throw new Error(data.error ? data.error.message : `${response.status} ${text}`);
  }
  return data;
}

const key = (item) => `${item.session}\u0000${item.id}`;
// Not ended: shown as live (a Stop button). `status` counts a waiting item (§14) in
// neither `running` nor `sessions`; a restarting one (§15) is running.
const running = (item) => item.state !== 'ended';
const waiting = (item) => item.state === 'waiting';
const counted = (item) => running(item) && !waiting(item);
// Whether an item ran at all: a waiting item that ended (cancelled or stopped) never did.
const ran = (item) => !waiting(item)
  && !(item.state === 'ended' && (item.kind === 'job' || item.kind === 'pane') && !item.pid
       && !item.slurm_job_id && !item.host);
// Ends that went wrong (not a stop someone asked for).
const FAILED = new Set(['failed', 'signaled', 'lost', 'spawn_failed']);
const failed = (item) => !running(item) && FAILED.has(item.end);
const RECENT_MS = 3600 * 1000;
const recent = (item) => item.ended_at && Date.now() - Date.parse(item.ended_at) < RECENT_MS;
const stateName = (item) => (running(item) ? item.state : item.end || 'ended');

function age(from, to) {
  let s = Math.max(0, Math.round(((to ? Date.parse(to) : Date.now()) - Date.parse(from)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(0)} KiB`;
  if (n < 1 << 30) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  return `${(n / (1 << 30)).toFixed(2)} GiB`;
}

// ---- the list ----

async function refresh() {
  if (view.loading) { view.again = true; return; }
  view.loading = true;
  try {
    view.items = (await api('/api/items')).items;
    render();
  } catch (e) {
    $('summary').textContent = `cannot list the work: ${e.message}`;
  } finally {
    view.loading = false;
    if (view.again) { view.again = false; refresh(); }
  }
}

function shown() {
  const keep = {
    now: (item) => running(item) || (failed(item) && recent(item)),
    running,
    ended: (item) => !running(item),
    all: () => true,
  }[view.filter] || running;
  const items = view.items.filter(keep);
  // Sessions in name order, a sub-agent's `S/sub-N` right under `S` (before `S-2`, which
  // sorts between them byte by byte), newest first within.
  const order = (session) => session.replace(/\/sub-(?=\d+(\/|$))/g, '\u0000');
  items.sort((a, b) => {
    const [x, y] = [order(a.session), order(b.session)];
    const made = (i) => Date.parse(i.started_at || i.created_at);
    return x < y ? -1 : x > y ? 1 : made(b) - made(a);
  });
  return items;
}

function render() {
  const all = view.items;
  // The counts of `status`: waiting items are counted apart, in no session.
  const live = all.filter(counted).length;
  const held = all.filter(waiting).length;
  const ended = all.filter((i) => !running(i)).length;
  const sessions = new Set(all.filter(counted).map((i) => i.session)).size;
  $('summary').textContent = `${live} running in ${sessions} session${sessions === 1 ? '' : 's'}`
    + (held ? ` · ${held} waiting` : '') + ` · ${ended} ended`;
  const items = shown();
  const fragment = [];
  const kept = new Map();
  let group = null;
  let session = null;
  for (const item of items.slice(0, view.limit)) {
    if (item.session !== session) {
      session = item.session;
      const sub = /\/sub-\d+$/.test(session);
      group = { head: el('h3', {}, sub ? `sub-agent ${session}` : `session ${session}`), rows: [], sub };
      fragment.push(group);
    }
    // A row whose item did not change is the same element (a click on it lands).
    // `progress` changes with every list; the row shows the age and `expected` instead.
    const signature = JSON.stringify([{ ...item, progress: undefined }, view.selected && key(view.selected) === key(item)]);
    const old = view.rows.get(key(item));
    const node = old && old.signature === signature ? old.node : row(item);
    node.querySelector('.age').textContent = ageText(item);
    kept.set(key(item), { node, signature });
    group.rows.push(node);
  }
  view.rows = kept;
  const groups = fragment.map((g) => el('div', { class: g.sub ? 'group sub' : 'group' }, g.head, ...g.rows));
  if (items.length === 0) {
    const empty = { now: 'Nothing is running, and nothing failed in the last hour.', running: 'Nothing is running.' };
    groups.push(el('p', { class: 'hint' }, empty[view.filter] || 'Nothing here.'));
  }
  $('groups').replaceChildren(...groups);
  const rest = items.length - Math.min(items.length, view.limit);
  $('more').hidden = rest <= 0;
  $('more').textContent = `Show ${Math.min(rest, PAGE_ROWS)} more (${rest} not shown)`;
  renderChart();
  renderFeed();
  if (view.selected) {
    const item = all.find((i) => key(i) === key(view.selected));
    if (item) updateDetail(item);
  }
}

// Counted from its real start: a waiting item has none yet (`started_at` is null).
const ageText = (item) => (!item.started_at
  ? (item.ended_at ? 'never ran' : `waiting ${age(item.created_at)}`)
  : running(item) ? `up ${age(item.started_at)}` : `ran ${age(item.started_at, item.ended_at)}`);

function row(item) {
  const what = item.name ? `${item.name} · ${item.command}` : item.command;
  const meta = [
    el('span', {}, item.kind.replace('_', '-')),
    el('span', { class: `badge state-${stateName(item)}` }, stateName(item)
      + (item.exit_code !== null && item.exit_code !== undefined ? ` ${item.exit_code}` : '')),
    el('span', { class: 'age', title: item.started_at || item.created_at }),
    item.pid ? el('span', {}, `pid ${item.pid}`) : null,
    item.host ? el('span', { class: 'host' }, `on ${item.host}`) : null,
    item.host_unreachable ? el('span', { class: 'unreachable' }, item.host_unreachable) : null,
    ...ports(item),
    item.waiting_for ? el('span', { class: 'waiting' }, item.waiting_for) : null,
    item.expected ? el('span', { class: 'expected' }, item.expected) : null,
    item.restart ? el('span', { class: 'restart', title: item.restart.refused || '' }, restartText(item.restart)) : null,
    item.cpu_ms !== undefined && item.cpu_ms !== null ? el('span', {}, `cpu ${(item.cpu_ms / 1000).toFixed(1)}s`) : null,
    item.rss_bytes ? el('span', {}, `mem ${bytes(item.rss_bytes)}`) : null,
  ];
  const selected = view.selected && key(view.selected) === key(item);
  return el('div', {
    class: selected ? 'row selected' : 'row',
    'data-id': item.id,
    'data-session': item.session,
    'data-state': stateName(item),
    onclick: () => select(item),
  },
  el('span', { class: 'id' }, item.id),
  el('span', { class: 'what', title: what }, what),
  el('span', { class: 'acts' }, ...actions(item)),
  el('span', { class: 'meta' }, ...meta));
}

// A restart policy's count, how the last run ended and when it starts again.
function restartText(restart) {
  // The wording of every reader (wire::restart_count).
  let text = `restarted ${restart.restarts} of ${restart.max_restarts} times`;
  if (restart.last_end) {
    const code = restart.last_signal ? ` sig ${restart.last_signal}`
      : (restart.last_exit_code !== undefined && restart.last_exit_code !== null ? ` ${restart.last_exit_code}` : '');
    text += `, last ${restart.last_end}${code}`;
  }
  if (restart.next_attempt_at) {
    text += `, next start ${new Date(restart.next_attempt_at).toLocaleTimeString()}`;
  }
  return text;
}

// A listening address as a link (a wildcard address is reached on loopback).
function ports(item) {
  const link = (address) => address.replace(/^0\.0\.0\.0:/, '127.0.0.1:').replace(/^\[::\]:/, '[::1]:');
  return (item.listening || []).map((address) => el('span', { class: 'ports' },
    'listening ', el('a', { href: `http://${link(address)}/`, target: '_blank', rel: 'noopener noreferrer' }, address)));
}

function actions(item) {
  const act = (label, path, extra) => el('button', {
    type: 'button',
    class: extra,
    'data-act': label.toLowerCase(),
    onclick: (event) => { event.stopPropagation(); perform(path, item, label); },
  }, label);
  if (running(item)) {
    const out = [act('Stop', '/api/stop', 'danger')];
    if (item.kind === 'pane') out.push(act('Close', '/api/close'));
    return out;
  }
  const out = [];
  if (item.kind === 'job' || item.kind === 'pane') out.push(act('Restart', '/api/restart'));
  out.push(act('Dismiss', '/api/dismiss'));
  return out;
}

async function perform(path, item, label) {
  try {
    await api(path, { session: item.session, id: item.id });
    refresh();
  } catch (e) {
    alertLine(`${label} ${item.id}: ${e.message}`);
  }
}

function alertLine(text) {
  const line = el('p', { class: 'error' }, text);
  $('detail').prepend(line);
  setTimeout(() => line.remove(), 8000);
}

// ---- the chart and the notices ----

// Items running in each minute of the last hour, as bars with a scale (failed runs in
// the fail colour on top), big enough to read.
function renderChart() {
  const now = Date.now();
  const buckets = 60;
  const [w, h, left, bottom, top] = [300, 150, 26, 18, 8];
  // What ran: a waiting item has not.
  const spans = view.items.filter((i) => i.started_at && ran(i)).map((i) => [Date.parse(i.started_at), i.ended_at ? Date.parse(i.ended_at) : now, failed(i)]);
  const counts = [];
  for (let b = 0; b < buckets; b++) {
    const t = now - (buckets - 1 - b) * 60000;
    const during = spans.filter(([s, e]) => s <= t && e >= t - 60000);
    counts.push([during.length, during.filter(([, , bad]) => bad).length]);
  }
  const most = Math.max(1, ...counts.map(([n]) => n));
  const ns = 'http://www.w3.org/2000/svg';
  const make = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const plot = h - bottom - top;
  const y = (n) => top + plot - (n / most) * plot;
  const width = (w - left) / buckets;
  const parts = [];
  for (const n of new Set([0, Math.ceil(most / 2), most])) {
    parts.push(make('line', { x1: left, x2: w, y1: y(n), y2: y(n) }));
    parts.push(make('text', { x: left - 4, y: y(n) + 4, 'text-anchor': 'end' }, String(n)));
  }
  counts.forEach(([n, bad], b) => {
    const x = left + b * width + 0.5;
    const bar = make('rect', { x, width: width - 1, y: y(n), height: y(0) - y(n) });
    bar.append(make('title', {}, `${n} running ${buckets - 1 - b} min ago${bad ? `, ${bad} of them failed` : ''}`));
    parts.push(bar);
    if (bad) parts.push(make('rect', { class: 'failed', x, width: width - 1, y: y(n), height: y(0) - y(bad) }));
  });
  parts.push(make('text', { x: left, y: h - 4 }, '60 min ago'));
  parts.push(make('text', { x: (left + w) / 2, y: h - 4, 'text-anchor': 'middle' }, '30'));
  parts.push(make('text', { x: w, y: h - 4, 'text-anchor': 'end' }, 'now'));
  $('chart').replaceChildren(...parts);
}

// The newest ends, a failed one marked as such (colour, a mark and its class).
function renderFeed() {
  const ended = view.items.filter((i) => i.ended_at && i.report)
    .sort((a, b) => Date.parse(b.ended_at) - Date.parse(a.ended_at)).slice(0, 40);
  $('feed').replaceChildren(...ended.map((i) => el('li', {
    'data-id': i.id,
    'data-end': i.end,
    class: failed(i) ? 'failed' : null,
  },
  el('time', { datetime: i.ended_at }, new Date(i.ended_at).toLocaleTimeString()),
  el('span', { class: 'mark', 'aria-label': failed(i) ? 'failed' : i.end }, failed(i) ? '✗' : i.end === 'succeeded' ? '✓' : '■'),
  i.session === 'default' ? '' : `[${i.session}] `, i.report)));
}

// ---- the selected item ----

function select(item) {
  if (view.follow) view.follow.close();
  view.follow = null;
  view.selected = { session: item.session, id: item.id };
  for (const node of document.querySelectorAll('.row.selected')) node.classList.remove('selected');
  for (const node of document.querySelectorAll('.row')) {
    if (node.dataset.id === item.id && node.dataset.session === item.session) node.classList.add('selected');
  }
  const detail = $('detail');
  const head = el('div', { class: 'head' });
  detail.replaceChildren(head);
  detail.dataset.key = key(item);
  updateDetail(item);
  if (item.kind === 'pane') {
    const screen = el('pre', { class: 'term screen', id: 'screen' });
    detail.append(screen, keysForm(item));
    view.follow = followScreen(item, screen);
  } else {
    const earlier = el('button', { type: 'button', id: 'earlier', hidden: true }, 'Load earlier');
    const out = el('pre', { class: 'term', id: 'output' });
    detail.append(earlier, out);
    view.follow = followOutput(item, out, earlier);
  }
}

function updateDetail(item) {
  const head = document.querySelector('#detail .head');
  if (!head) return;
  const parts = [
    el('h2', {}, `${item.id}${item.name ? ` · ${item.name}` : ''}`),
    el('div', { class: 'facts' },
      el('span', {}, `session ${item.session}`),
      el('span', {}, item.kind.replace('_', '-')),
      el('span', { class: `badge state-${stateName(item)}` }, stateName(item)),
      item.pid ? el('span', {}, `pid ${item.pid}`) : null,
      el('span', {}, `cwd ${item.cwd}`),
      ...ports(item)),
    el('code', {}, item.command),
    item.report ? el('div', { class: 'report' }, item.report) : null,
    el('div', { class: 'acts' }, ...actions(item))];
  head.replaceChildren(...parts.filter((part) => part !== null));
}

const query = (target, extra) => {
  const params = new URLSearchParams({ session: target.session, id: target.id, ...(extra || {}) });
  return params.toString();
};

function decodeBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// An event stream that opens again a second after it fails (a daemon restarting), and
// that pauses while the tab is hidden: a browser opens at most six connections to one
// address, so tabs left open in the background must not hold theirs.
function stream(url, handlers) {
  let source = null;
  let closed = false;
  let paused = false;
  const open = () => {
    source = new EventSource(url());
    for (const [name, handler] of Object.entries(handlers)) source.addEventListener(name, handler);
    source.onerror = () => {
      source.close();
      // (Unless it was paused and resumed meanwhile, and is open again.)
      setTimeout(() => {
        if (!closed && !paused && source.readyState === EventSource.CLOSED) open();
      }, 1000);
    };
  };
  open();
  return {
    close: () => { closed = true; source.close(); },
    pause: () => { paused = true; source.close(); },
    resume: () => { if (paused && !closed) { paused = false; open(); } },
  };
}

// An item's output, streamed from the log by offset; goes on where it stopped.
function followOutput(item, pre, earlier) {
  const term = new Term(pre);
  const decoder = new TextDecoder('utf-8');
  let first = null; // the first offset shown
  let next = null; // where the stream goes on
  const follow = stream(() => `/api/output?${query(item, next === null ? {} : { from: next })}`, {
    output: (event) => {
      const chunk = JSON.parse(event.data);
      if (first === null) {
        first = chunk.from;
        earlier.hidden = first === 0;
      }
      if (chunk.dropped_bytes > 0 && next !== null && chunk.from > next) {
        term.marker(`[${chunk.dropped_bytes} bytes of the middle were dropped (the log cap)]`);
      }
      term.write(decoder.decode(decodeBase64(chunk.bytes), { stream: true }));
      next = chunk.to;
    },
    end: (event) => {
      const end = JSON.parse(event.data);
      if (first === null) { first = end.to; earlier.hidden = first === 0; }
      term.write(decoder.decode());
      if (end.report) term.marker(end.report);
      follow.close();
    },
    failed: (event) => {
      term.marker(`cannot read: ${event.data}`);
      follow.close();
    },
  });
  earlier.addEventListener('click', async () => {
    if (first === null || first === 0) return;
    const from = Math.max(0, first - EARLIER_BYTES);
    try {
      const reply = await api(`/api/read?${query(item, { from, to: first })}`);
      const text = new TextDecoder('utf-8').decode(decodeBase64(reply.output_base64 || ''));
      term.prepend(text);
      first = reply.from;
      earlier.hidden = first === 0;
    } catch (e) {
      alertLine(`load earlier: ${e.message}`);
    }
  });
  return follow;
}

function followScreen(item, pre) {
  const follow = stream(() => `/api/screen?${query(item)}`, {
    screen: (event) => { pre.textContent = JSON.parse(event.data).text; },
    end: () => follow.close(),
    failed: (event) => {
      follow.close();
      pre.append(el('span', { class: 'marker' }, `\ncannot read the screen: ${event.data}`));
    },
  });
  return follow;
}

function keysForm(item) {
  const input = el('input', { type: 'text', name: 'text', autocomplete: 'off', placeholder: 'text to type; Enter sends it with a newline', 'aria-label': 'text to send' });
  const send = async (body) => {
    try {
      await api('/api/send', { session: item.session, id: item.id, ...body });
    } catch (e) {
      alertLine(`send to ${item.id}: ${e.message}`);
    }
  };
  const keyButton = (label, name) => el('button', {
    type: 'button', 'data-key': name, onclick: () => send({ keys: [name] }),
  }, label);
  return el('form', {
    class: 'keys',
    onsubmit: (event) => {
      event.preventDefault();
      // The text is typed as it is: backslashes are not escapes here.
      send({ text: `${input.value.replace(/\\/g, '\\\\')}\\n` });
      input.value = '';
    },
  }, input, el('button', { type: 'submit' }, 'Send'),
  keyButton('Enter', 'Enter'), keyButton('Tab', 'Tab'), keyButton('↑', 'Up'),
  keyButton('↓', 'Down'), keyButton('Esc', 'Esc'), keyButton('Ctrl-C', 'C-c'), keyButton('Ctrl-D', 'C-d'));
}

// ---- escapes to colour ----

const BASE = ['#2e3436', '#cc0000', '#4e9a06', '#c4a000', '#3465a4', '#75507b', '#06989a', '#d3d7cf',
  '#555753', '#ef2929', '#8ae234', '#fce94f', '#729fcf', '#ad7fa8', '#34e2e2', '#eeeeec'];

function colour256(n) {
  if (n < 16) return BASE[n];
  if (n < 232) {
    const c = n - 16;
    const level = (v) => (v === 0 ? 0 : 55 + v * 40);
    return `rgb(${level(Math.floor(c / 36))},${level(Math.floor(c / 6) % 6)},${level(c % 6)})`;
  }
  const g = 8 + (n - 232) * 10;
  return `rgb(${g},${g},${g})`;
}

const CSI = /\x1b\[([0-?]*)([ -/]*)([@-~])/y;
const OSC = /\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)/y;
const ESC2 = /\x1b[@-Z\\^_]/y;
const CHARSET = /\x1b[()*+][0-9A-Za-z]/y;
// The start of an escape cut by the end of a chunk: kept for the next one. Anything else
// after an ESC is text (an OSC does not run past a line).
const PARTIAL = /\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b\n]*\x1b?|[()*+])?$/y;

// A terminal-ish renderer for logs: SGR colours, `\r` rewrites the line (progress bars
// collapse to their last state), other escapes are dropped.
class Term {
  constructor(pre) {
    this.pre = pre;
    this.style = {};
    this.carry = '';
    this.cr = false;
    this.line = null;
    this.newLine();
  }

  newLine() {
    this.line = el('div', { class: 'line' });
    this.pre.append(this.line);
    while (this.pre.childElementCount > MAX_LINES) this.pre.firstElementChild.remove();
  }

  marker(text) {
    if (this.line.textContent !== '') this.newLine();
    this.line.append(el('span', { class: 'marker' }, text));
    this.newLine();
  }

  prepend(text) {
    const holder = el('pre');
    const older = new Term(holder);
    older.write(text);
    const lines = Array.from(holder.children);
    this.pre.prepend(...lines);
  }

  write(chunk) {
    const stick = this.pre.scrollHeight - this.pre.scrollTop - this.pre.clientHeight < 24;
    const text = this.carry + chunk;
    this.carry = '';
    let run = '';
    const flush = () => { if (run !== '') { this.put(run); run = ''; } };
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      if (c === '\x1b') {
        flush();
        let match = null;
        for (const pattern of [CSI, OSC, CHARSET, ESC2]) {
          pattern.lastIndex = i;
          match = pattern.exec(text);
          if (match) {
            if (pattern === CSI && match[3] === 'm' && match[2] === '') this.sgr(match[1]);
            i = pattern.lastIndex;
            break;
          }
        }
        if (match) continue;
        PARTIAL.lastIndex = i;
        if (text.length - i < 256 && PARTIAL.test(text)) { this.carry = text.slice(i); break; }
        i += 1; // an escape that never ends: the ESC is dropped, the rest is text
        continue;
      }
      if (c === '\n') { flush(); this.cr = false; this.newLine(); i += 1; continue; }
      if (c === '\r') { flush(); this.cr = true; i += 1; continue; }
      if (c === '\b') { flush(); this.backspace(); i += 1; continue; }
      const code = c.charCodeAt(0);
      if ((code < 0x20 && c !== '\t') || code === 0x7f) { i += 1; continue; }
      if (this.cr) { flush(); this.line.replaceChildren(); this.cr = false; }
      run += c;
      i += 1;
    }
    flush();
    if (stick) this.pre.scrollTop = this.pre.scrollHeight;
  }

  put(text) {
    const s = this.style;
    const plain = !s.fg && !s.bg && !s.b && !s.d && !s.i && !s.u && !s.inv;
    if (plain) { this.line.append(text); return; }
    const span = el('span', { class: ['b', 'd', 'i', 'u'].filter((k) => s[k]).join(' ') || undefined }, text);
    let fg = s.fg;
    let bg = s.bg;
    if (s.inv) { [fg, bg] = [bg || 'var(--term-bg)', fg || 'var(--term-fg)']; }
    if (fg) span.style.color = fg;
    if (bg) span.style.backgroundColor = bg;
    this.line.append(span);
  }

  backspace() {
    const last = this.line.lastChild;
    if (!last) return;
    const node = last.nodeType === Node.TEXT_NODE ? last : last.firstChild;
    if (node && node.data.length > 0) node.data = node.data.slice(0, -1);
    if (last.textContent === '') last.remove();
  }

  sgr(params) {
    const codes = params === '' ? [0] : params.split(/[;:]/).map((p) => (p === '' ? 0 : Number(p)));
    const s = this.style;
    for (let k = 0; k < codes.length; k++) {
      const n = codes[k];
      if (n === 0) { for (const name of Object.keys(s)) delete s[name]; }
      else if (n === 1) s.b = true;
      else if (n === 2) s.d = true;
      else if (n === 3) s.i = true;
      else if (n === 4) s.u = true;
      else if (n === 7) s.inv = true;
      else if (n === 22) { s.b = false; s.d = false; }
      else if (n === 23) s.i = false;
      else if (n === 24) s.u = false;
      else if (n === 27) s.inv = false;
      else if (n >= 30 && n <= 37) s.fg = BASE[n - 30];
      else if (n >= 90 && n <= 97) s.fg = BASE[n - 90 + 8];
      else if (n >= 40 && n <= 47) s.bg = BASE[n - 40];
      else if (n >= 100 && n <= 107) s.bg = BASE[n - 100 + 8];
      else if (n === 39) s.fg = null;
      else if (n === 49) s.bg = null;
      else if (n === 38 || n === 48) {
        let colour = null;
        if (codes[k + 1] === 5) { colour = colour256(codes[k + 2] & 255); k += 2; }
        else if (codes[k + 1] === 2) {
          colour = `rgb(${codes[k + 2] & 255},${codes[k + 3] & 255},${codes[k + 4] & 255})`; k += 4;
        }
        if (n === 38) s.fg = colour; else s.bg = colour;
      }
    }
  }
}

// ---- wiring ----

for (const button of document.querySelectorAll('#filters button')) {
  button.addEventListener('click', () => {
    view.filter = button.dataset.filter;
    view.limit = PAGE_ROWS;
    for (const b of document.querySelectorAll('#filters button')) b.classList.toggle('on', b === button);
    render();
  });
}
$('more').addEventListener('click', () => { view.limit += PAGE_ROWS; render(); });

function listen() {
  const events = new EventSource('/api/events');
  events.addEventListener('changed', refresh);
  events.onopen = () => { $('conn').textContent = 'live'; $('conn').className = 'conn live'; };
  events.onerror = () => {
    $('conn').textContent = 'daemon not answering: retrying (if it restarted, run `bgwork ui`)';
    $('conn').className = 'conn down';
  };
  return events;
}

let events = listen();
document.addEventListener('visibilitychange', () => {
  if (document.hidden) {
    events.close();
    if (view.follow) view.follow.pause();
    $('conn').textContent = 'paused while hidden';
    $('conn').className = 'conn';
  } else {
    events = listen();
    refresh();
    if (view.follow) view.follow.resume();
  }
});
refresh();
setInterval(render, 5000);
