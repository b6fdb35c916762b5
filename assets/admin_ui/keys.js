// The keys console of the budget page (issue 29, point 8): each tenant's
// keys created through the admin API, listed, created, rotated and revoked
// with the admin token the page holds. A token that may not change keys
// (role read, or another tenant's scope) gets the API's own message. A new
// secret is shown once, in the tenant's panel, and never stored.
// The panels outlive the page's refresh: they are kept by tenant name and
// moved into each new rendering of the tenant's card.
'use strict';

const keyPanels = new Map();

function keysRequest(method, path, body) {
  const tok = sessionStorage.getItem('budgetgate.adminToken');
  const init = { method, headers: { Authorization: 'Bearer ' + tok }, cache: 'no-store' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  return fetch(path, init).then(async (r) => {
    let v = null;
    try { v = await r.json(); } catch (_) { /* no body */ }
    if (!r.ok) {
      const msg = v && v.error && v.error.message ? v.error.message : 'HTTP ' + r.status;
      throw new Error(msg);
    }
    return v;
  });
}

function keysPath(tenant) {
  return '/admin/v1/tenants/' + encodeURIComponent(tenant) + '/keys';
}

function node(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function showSecret(panel, what, secret) {
  const out = panel.querySelector('.secret');
  out.replaceChildren(node('span', null, what + ' (shown once, copy it now): '), node('code', 'secret-value', secret));
  out.hidden = false;
}

function showError(panel, message) {
  const err = panel.querySelector('.keys-error');
  err.textContent = message;
  err.hidden = !message;
}

async function loadKeys(panel) {
  const tenant = panel.dataset.tenant;
  try {
    const v = await keysRequest('GET', keysPath(tenant) + '?limit=1000');
    const list = panel.querySelector('.key-list');
    const rows = v.data.map((k) => keyRow(panel, k));
    list.replaceChildren(...rows);
    if (rows.length === 0) list.replaceChildren(node('li', 'empty', 'No keys created through the API.'));
  } catch (e) {
    showError(panel, e.message);
  }
}

function keyRow(panel, k) {
  const li = node('li', 'key');
  li.dataset.key = k.id;
  li.dataset.revoked = k.revoked_at ? 'true' : 'false';
  let text = k.id + (k.alias ? ' · ' + k.alias : '');
  if (k.revoked_at) text += ' · revoked ' + new Date(k.revoked_at * 1000).toLocaleString();
  else if ((k.retiring_secrets_until || []).length) text += ' · previous secret works until ' +
    new Date(Math.max(...k.retiring_secrets_until) * 1000).toLocaleString();
  li.appendChild(node('span', 'name', text));
  if (!k.revoked_at) {
    const base = keysPath(panel.dataset.tenant) + '/' + encodeURIComponent(k.id);
    const rotate = node('button', 'rotate', 'Rotate');
    rotate.type = 'button';
    rotate.addEventListener('click', async () => {
      showError(panel, '');
      try {
        const v = await keysRequest('POST', base + '/rotate', { overlap_secs: 3600 });
        showSecret(panel, 'New secret of ' + k.id, v.secret);
      } catch (e) { showError(panel, e.message); }
      loadKeys(panel);
    });
    const revoke = node('button', 'revoke', 'Revoke');
    revoke.type = 'button';
    revoke.addEventListener('click', async () => {
      // Two clicks: the first asks, the second revokes.
      if (revoke.dataset.armed !== 'true') {
        revoke.dataset.armed = 'true';
        revoke.textContent = 'Revoke ' + k.id + ' everywhere?';
        return;
      }
      showError(panel, '');
      try {
        await keysRequest('POST', base + '/revoke');
      } catch (e) { showError(panel, e.message); }
      loadKeys(panel);
    });
    li.append(rotate, revoke);
  }
  return li;
}

function newKeyPanel(tenant) {
  const panel = node('details', 'keys-console');
  panel.dataset.tenant = tenant;
  panel.appendChild(node('summary', null, 'Manage keys'));
  const form = node('form', 'key-create');
  form.autocomplete = 'off';
  const label = node('label', null, 'alias ');
  const alias = node('input', 'alias');
  alias.type = 'text';
  alias.maxLength = 1024;
  label.appendChild(alias);
  const create = node('button', 'create', 'Create key');
  create.type = 'submit';
  form.append(label, create);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const body = alias.value.trim() ? { alias: alias.value.trim() } : {};
    showError(panel, '');
    try {
      const v = await keysRequest('POST', keysPath(tenant), body);
      alias.value = '';
      showSecret(panel, 'Secret of new key ' + v.id, v.secret);
    } catch (e) { showError(panel, e.message); }
    loadKeys(panel);
  });
  const secret = node('p', 'secret');
  secret.hidden = true;
  const err = node('p', 'keys-error error');
  err.hidden = true;
  panel.append(form, secret, err, node('ul', 'key-list'));
  panel.addEventListener('toggle', () => {
    if (panel.open) {
      showError(panel, '');
      loadKeys(panel);
    }
  });
  return panel;
}

// The keys panel of `tenant`, the same element across refreshes.
function keysConsole(tenant) {
  let p = keyPanels.get(tenant);
  if (!p) {
    p = newKeyPanel(tenant);
    keyPanels.set(tenant, p);
  }
  return p;
}

// Forgetting the token forgets the panels (and any secret shown in them).
function forgetKeyPanels() {
  keyPanels.clear();
}
