// The live budget page: reads /admin/v1/budgets with the admin token and
// draws every budget as a bar of remaining / capacity, and each tenant's
// spend of the last 30 days from /admin/v1/spend. No framework, no
// build step. Names from the config are inserted with textContent only,
// never as HTML. The token lives in this tab's sessionStorage, never in a URL.
'use strict';

const TOKEN_KEY = 'budgetgate.adminToken';
const REFRESH_MS = 5000; // the bound: at most every 5 s
const PAGE = 200;
const MAX_PAGES = 50;

const $ = (id) => document.getElementById(id);
const fmt = new Intl.NumberFormat('en-US');

class AuthError extends Error {}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function isLoopback(host) {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\./.test(host);
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// Each tenant's active runs shown: those with the most tokens reserved.
const RUNS = 5;

async function fetchAll(tok) {
  const out = { version: '', tenants: [], upstreams: [], queue: null };
  let after = null;
  for (let i = 0; i < MAX_PAGES; i++) {
    let url = '/admin/v1/budgets?limit=' + PAGE + '&runs=' + RUNS;
    if (after !== null) url += '&after=' + encodeURIComponent(after);
    const r = await fetch(url, { headers: { Authorization: 'Bearer ' + tok }, cache: 'no-store' });
    if (r.status === 401) throw new AuthError('The admin token was refused.');
    if (!r.ok) {
      let msg = 'HTTP ' + r.status;
      try { msg = (await r.json()).error.message; } catch (_) { /* keep the status */ }
      throw new Error(msg);
    }
    const page = await r.json();
    out.version = page.policy_version;
    out.tenants.push(...page.tenants);
    if (page.upstreams) out.upstreams = page.upstreams;
    if (page.queue) out.queue = page.queue;
    if (!page.next_after) break;
    after = page.next_after;
  }
  return out;
}

const DAY_MS = 86400000;
const CHART_DAYS = 30;

// Each tenant's own spend per UTC day of the last 30 days, from the spend
// ledger; null when the gateway has no ledger database (the chart is left out).
async function fetchSpend(tok) {
  const r = await fetch('/admin/v1/spend?group_by=tenant&period=day', {
    headers: { Authorization: 'Bearer ' + tok }, cache: 'no-store',
  });
  if (r.status === 401) throw new AuthError('The admin token was refused.');
  if (!r.ok) return null;
  const body = await r.json();
  const out = new Map();
  for (const g of body.data) {
    if (!out.has(g.tenant)) out.set(g.tenant, new Map());
    out.get(g.tenant).set(g.period, g.cost_micros);
  }
  return out;
}

// The last 30 UTC days, oldest first, as YYYY-MM-DD.
function lastDays() {
  const today = Math.floor(Date.now() / DAY_MS);
  const out = [];
  for (let d = today - CHART_DAYS + 1; d <= today; d++) {
    out.push(new Date(d * DAY_MS).toISOString().slice(0, 10));
  }
  return out;
}

function dollars(micros) {
  return '$' + (micros / 1e6).toFixed(micros > 0 && micros < 10000 ? 4 : 2);
}

// A tenant's spend per day: its own and its descendants' (their requests
// are charged to it too).
function subtreeSpend(t, children, spend, days) {
  const own = spend.get(t.name) || new Map();
  const total = days.map((d) => own.get(d) || 0);
  for (const child of children.get(t.name) || []) {
    subtreeSpend(child, children, spend, days).forEach((v, i) => { total[i] += v; });
  }
  return total;
}

function spendChart(perDay, days) {
  const sum = perDay.reduce((a, b) => a + b, 0);
  const s = el('div', 'spend');
  s.dataset.totalMicros = String(sum);
  s.appendChild(el('h4', null, 'spend, last 30 days: ' + dollars(sum)));
  const chart = el('div', 'chart');
  chart.setAttribute('role', 'img');
  chart.setAttribute('aria-label', 'spend per day, last 30 days, ' + dollars(sum) + ' in all');
  const max = Math.max(...perDay, 1);
  perDay.forEach((v, i) => {
    const bar = el('div', 'day');
    bar.dataset.day = days[i];
    bar.dataset.micros = String(v);
    bar.title = days[i] + ': ' + dollars(v);
    const fill = el('div', 'amount');
    fill.style.height = (v > 0 ? Math.max(4, (v / max) * 100) : 0).toFixed(1) + '%';
    bar.appendChild(fill);
    chart.appendChild(bar);
  });
  s.appendChild(chart);
  return s;
}

// Durations as the gateway writes them are Go-style; this shows µs compactly.
function human(micros) {
  let s = Math.ceil(micros / 1e6);
  if (s < 60) return s + ' s';
  const m = Math.floor(s / 60); s %= 60;
  if (m < 60) return m + ' min ' + (s ? s + ' s' : '');
  const h = Math.floor(m / 60);
  if (h < 48) return h + ' h ' + (m % 60) + ' min';
  return Math.floor(h / 24) + ' d ' + (h % 24) + ' h';
}

function resetText(b) {
  if (b.kind === 'bucket') return b.reset_micros > 0 ? 'full in ' + human(b.reset_micros) : 'full';
  // A rolling window never resets whole: say when its oldest units slide out.
  if (b.kind === 'quota' && b.next_slide) {
    const n = b.next_slide.units;
    const amount = b.unit === 'usd_micros' ? '$' + (n / 1e6).toFixed(2) : n + ' ' + b.unit;
    return amount + ' slide out in ' + human(b.next_slide.in_micros) + ' (' + b.window + ', empty in ' + human(b.reset_micros) + ')';
  }
  if (b.kind === 'quota') return 'resets in ' + human(b.reset_micros) + (b.window ? ' (' + b.window + ')' : '');
  return '';
}

function budgetRow(b) {
  const row = el('div', 'budget');
  row.dataset.scope = b.scope;
  row.dataset.budget = b.budget;
  row.dataset.remaining = String(b.remaining);
  row.dataset.capacity = String(b.capacity);
  row.appendChild(el('span', 'name', b.budget + (b.shadow ? ' (shadow)' : '')));
  const share = b.capacity > 0 ? Math.max(0, Math.min(1, b.remaining / b.capacity)) : 0;
  const bar = el('div', 'bar');
  bar.setAttribute('role', 'meter');
  bar.setAttribute('aria-valuemin', '0');
  bar.setAttribute('aria-valuemax', String(b.capacity));
  bar.setAttribute('aria-valuenow', String(Math.max(0, b.remaining)));
  bar.setAttribute('aria-label', b.scope + ' ' + b.budget);
  const fill = el('div', 'fill' + (share < 0.1 ? ' low' : share < 0.3 ? ' mid' : ''));
  fill.style.width = (share * 100).toFixed(1) + '%';
  bar.appendChild(fill);
  row.appendChild(bar);
  const unit = b.unit || '';
  // Dollar budgets come with their amounts as decimal-dollar strings.
  const numbers = b.usd
    ? '$' + b.usd.remaining + ' / $' + b.usd.limit
    : fmt.format(b.remaining) + ' / ' + fmt.format(b.capacity) + ' ' + unit;
  row.appendChild(el('span', 'numbers', numbers));
  // Usage settled above its reservation (expected-mode turns) shows as debt.
  if (b.debt > 0) {
    row.appendChild(el('span', 'debt', 'debt ' + fmt.format(b.debt) + ' ' + unit));
  }
  row.appendChild(el('span', 'reset', resetText(b)));
  return row;
}

const SCOPE_TITLES = { tenant: 'tenant', key: 'key', tenant_model: 'model', upstream: 'deployment' };

function scopes(budgets) {
  const groups = new Map();
  for (const b of budgets) {
    if (!groups.has(b.scope)) groups.set(b.scope, []);
    groups.get(b.scope).push(b);
  }
  const frag = document.createDocumentFragment();
  for (const [scope, list] of groups) {
    const s = el('div', 'scope');
    s.dataset.scope = scope;
    const first = list[0];
    s.appendChild(el('h4', null, (SCOPE_TITLES[first.scope_kind] || first.scope_kind) + ' ' + first.scope_name));
    list.forEach((b) => s.appendChild(budgetRow(b)));
    frag.appendChild(s);
  }
  return frag;
}

function card(cls, name, meta, budgets, more) {
  const c = el('div', 'card ' + cls);
  c.dataset.name = name;
  c.appendChild(el('h3', null, name));
  if (meta) c.appendChild(el('div', 'meta', meta));
  if (budgets.length === 0 && !more) c.appendChild(el('div', 'empty', 'no limits configured'));
  c.appendChild(scopes(budgets));
  return c;
}

// The limits every end user of a tenant has: configured values, no state
// (end users are too many to list; the admin API reads one by its hash).
function endUserLimits(limits) {
  const s = el('div', 'end-users');
  s.appendChild(el('h4', null, 'each end user'));
  for (const l of limits) {
    const row = el('div', 'limit');
    row.dataset.budget = l.budget;
    row.dataset.limit = String(l.limit);
    row.appendChild(el('span', 'name', l.budget));
    const numbers = l.unit === 'usd_micros'
      ? '$' + (l.limit / 1e6).toFixed(2)
      : fmt.format(l.limit) + ' ' + l.unit;
    row.appendChild(el('span', 'numbers', numbers));
    s.appendChild(row);
  }
  return s;
}

const REASONS = { rate_limited: 'rate limit', quota: 'quota', concurrency: 'concurrency', impossible: 'larger than the budget' };

async function openExplain(path) {
  const r = await fetch(path, { headers: { Authorization: 'Bearer ' + token() }, cache: 'no-store' });
  const text = JSON.stringify(await r.json(), null, 2);
  window.open(URL.createObjectURL(new Blob([text], { type: 'application/json' })), '_blank', 'noopener');
}

function refusals(list) {
  const s = el('div', 'refusals');
  s.appendChild(el('h4', null, 'refused in the last 10 minutes: ' + list.length + (list.length >= 16 ? '+' : '')));
  const ul = el('ul');
  for (const r of list) {
    const li = el('li', 'refusal');
    li.dataset.budget = r.budget;
    li.dataset.scope = r.scope;
    li.dataset.reason = r.reason;
    li.textContent = new Date(r.at_micros / 1000).toLocaleTimeString() + ' · ' + r.budget +
      ' of ' + r.scope + ' · ' + (REASONS[r.reason] || r.reason);
    if (r.explain) {
      // "Why was this refused?": the kept record, read with the page's token.
      const a = el('a', 'explain', 'why?');
      a.href = r.explain;
      a.dataset.requestId = r.request_id;
      a.addEventListener('click', (ev) => { ev.preventDefault(); openExplain(r.explain); });
      li.appendChild(document.createTextNode(' · '));
      li.appendChild(a);
    }
    ul.appendChild(li);
  }
  s.appendChild(ul);
  return s;
}

// A tenant's active runs, most tokens reserved first: id, tokens reserved,
// and each limit's remaining (the run's budgets, from its record's limits).
function runs(list) {
  const s = el('div', 'runs');
  s.appendChild(el('h4', null, 'active runs (most tokens first)'));
  for (const r of list) {
    const row = el('div', 'run');
    row.dataset.run = r.id;
    row.dataset.spent = String(r.spent);
    row.appendChild(el('span', 'name', r.id));
    row.appendChild(el('span', 'spent', fmt.format(r.spent) + ' tokens reserved'));
    if (r.budgets.length === 0) row.appendChild(el('span', 'limit', 'no limits'));
    for (const b of r.budgets) {
      const l = el('span', 'limit');
      l.dataset.budget = b.budget;
      l.dataset.remaining = String(b.remaining);
      l.textContent = b.budget + ': ' + (b.usd
        ? '$' + b.usd.remaining + ' / $' + b.usd.limit
        : fmt.format(b.remaining) + ' / ' + fmt.format(b.capacity) + ' ' + b.unit) + ' left';
      row.appendChild(l);
    }
    s.appendChild(row);
  }
  return s;
}

function tenantCard(t, children, spend) {
  const eu = t.end_user_limits || [];
  const refused = t.recent_refusals || [];
  const meta = (t.keys.length ? 'keys: ' + t.keys.join(', ') : 'no keys') +
    (t.parent ? ' · child of ' + t.parent : '') + (t.shadow ? ' · shadow mode' : '');
  const c = card('tenant' + (refused.length ? ' refused' : ''), t.name, meta, t.budgets, eu.length > 0);
  if (eu.length) c.appendChild(endUserLimits(eu));
  if (spend) {
    const days = lastDays();
    c.appendChild(spendChart(subtreeSpend(t, children, spend, days), days));
  }
  if (t.runs && t.runs.length) c.appendChild(runs(t.runs));
  if (refused.length) c.appendChild(refusals(refused));
  c.appendChild(keysConsole(t.name));
  const kids = children.get(t.name) || [];
  if (kids.length) {
    const k = el('div', 'children');
    kids.forEach((child) => k.appendChild(tenantCard(child, children, spend)));
    c.appendChild(k);
  }
  return c;
}

// Children under their parent; a tenant whose parent is not listed (none,
// or beyond the pages read) is a root.
function tenantTree(list, spend) {
  const names = new Set(list.map((t) => t.name));
  const children = new Map();
  const roots = [];
  for (const t of list) {
    if (t.parent && names.has(t.parent)) {
      if (!children.has(t.parent)) children.set(t.parent, []);
      children.get(t.parent).push(t);
    } else {
      roots.push(t);
    }
  }
  return roots.map((t) => tenantCard(t, children, spend));
}

function render(data) {
  const tenants = $('tenants');
  tenants.replaceChildren(...tenantTree(data.tenants, data.spend));
  if (data.tenants.length === 0) tenants.replaceChildren(el('p', 'empty', 'No tenants configured.'));
  const ups = $('upstreams');
  ups.replaceChildren(...data.upstreams.map((u) => card('upstream', u.name, 'kind: ' + u.kind, u.budgets)));
  if (data.upstreams.length === 0) ups.replaceChildren(el('p', 'empty', 'No upstream deployments configured.'));
  const q = $('queue');
  if (!data.queue || !data.queue.enabled) {
    q.replaceChildren(el('p', 'empty', 'No wait queue configured: refusals are answered at once.'));
  } else {
    const rows = Object.entries(data.queue.depth).map(([cls, n]) => {
      const row = el('div', 'queue-depth');
      row.dataset.class = cls;
      row.append(el('span', 'name', cls), el('span', 'value', String(n) + ' waiting'));
      return row;
    });
    q.replaceChildren(...rows);
  }
}

function showPrompt(message) {
  $('view').hidden = true;
  $('forget').hidden = true;
  $('tenants').replaceChildren();
  $('upstreams').replaceChildren();
  $('queue').replaceChildren();
  $('status').textContent = '';
  $('token-form').hidden = false;
  const err = $('token-error');
  err.textContent = message || '';
  err.hidden = !message;
  $('token').focus();
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  const tok = token();
  if (!tok) { showPrompt(); return; }
  const status = $('status');
  try {
    const data = await fetchAll(tok);
    data.spend = await fetchSpend(tok);
    render(data);
    $('token-form').hidden = true;
    $('view').hidden = false;
    $('forget').hidden = false;
    status.classList.remove('stale');
    status.textContent = 'policy ' + data.version + ' · updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    if (e instanceof AuthError) {
      sessionStorage.removeItem(TOKEN_KEY);
      showPrompt(e.message);
      return;
    }
    status.classList.add('stale');
    status.textContent = 'not updated: ' + e.message + ' (retrying)';
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function start() {
  if (location.protocol === 'http:' && !isLoopback(location.hostname)) {
    $('plain-http').hidden = false;
  }
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const value = $('token').value.trim();
    $('token').value = '';
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    refresh();
  });
  $('forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    forgetKeyPanels();
    clearTimeout(timer);
    showPrompt();
  });
  refresh();
}

document.addEventListener('DOMContentLoaded', start);
