// The live page of `ckpt serve`: polls state.json and redraws only the sections whose version changed.
// Everything the server sends that comes from a store (names, settings, metric names) is data: it enters
// the page through textContent and setAttribute only, never as HTML (the page's CSP also runs no other script).
'use strict';

const POLL_MS = 1000;
const shownTables = new Map(); // store index -> tables_version shown
const loading = new Set(); // figure element ids whose section is being fetched

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function table(rows, columns) {
  const node = element('table');
  if (columns) {
    const head = element('tr');
    for (const column of columns) head.appendChild(element('th', column));
    node.appendChild(head);
  }
  for (const row of rows) {
    const line = element('tr');
    row.forEach((cell, i) => line.appendChild(element(i === 0 && !columns ? 'th' : 'td', cell)));
    node.appendChild(line);
  }
  return node;
}

function storeNode(index, store) {
  let node = document.getElementById('store-' + index);
  if (node === null) {
    node = element('section', null, 'store');
    node.id = 'store-' + index;
    node.dataset.store = String(index);
    node.appendChild(element('h2'));
    node.appendChild(element('div', null, 'tables'));
    node.appendChild(element('div', null, 'figures'));
    document.getElementById('stores').appendChild(node);
  }
  node.querySelector('h2').textContent = store.name;
  return node;
}

function showTables(index, store, node) {
  const tables = node.querySelector('.tables');
  if (store.problem) {
    tables.replaceChildren(element('p', store.problem, 'error'));
    shownTables.delete(index);
    return;
  }
  if (shownTables.get(index) === store.tables_version) return;
  const checkpoints = store.checkpoints;
  const list = table(checkpoints.rows, checkpoints.columns);
  list.className = 'checkpoints';
  const parts = [table(store.run), element('h3', 'Checkpoints'), list];
  if (checkpoints.earlier > 0) parts.push(element('p', 'and ' + checkpoints.earlier + ' earlier checkpoints', 'note'));
  tables.replaceChildren(...parts);
  shownTables.set(index, store.tables_version);
}

function figureNode(container, id, spec) {
  let node = document.getElementById(id);
  if (node === null) {
    node = element('figure');
    node.id = id;
    node.appendChild(element('h3', spec.title));
    node.appendChild(element('div', null, 'body'));
    node.appendChild(element('div', null, 'images'));
  }
  node.dataset.analyzer = spec.analyzer;
  container.appendChild(node); // keeps the server's order
  return node;
}

async function loadSection(index, id, spec, node) {
  loading.add(id);
  try {
    const answer = await fetch('/section/' + index + '/' + spec.id + '?v=' + spec.version, { cache: 'no-store' });
    if (!answer.ok) return; // the section went away between the poll and this request: the next poll says so
    const drawn = await answer.json();
    const body = [];
    if (drawn.stale) body.push(element('p', 'stale: the store\'s data or model changed after this result was computed; rerun ckpt analyze ' + drawn.rerun, 'stale'));
    if (drawn.rows && drawn.rows.length) body.push(table(drawn.rows));
    if (drawn.summary) body.push(element('pre', drawn.summary));
    for (const problem of drawn.problems || []) body.push(element('p', problem, 'error'));
    const images = drawn.alts.map((alt, i) => {
      const image = element('img');
      image.alt = alt;
      image.src = '/image/' + index + '/' + spec.id + '/' + drawn.version + '/' + i + '.png';
      return image;
    });
    await Promise.all(images.map((image) => image.decode().catch(() => undefined)));
    node.querySelector('.body').replaceChildren(...body);
    node.querySelector('.images').replaceChildren(...images);
    node.dataset.version = drawn.version;
    node.dataset.steps = drawn.steps.join(' ');
  } catch (error) { // the server went away mid-request: said in the status line, tried again at the next poll
    const status = document.getElementById('status');
    status.textContent = 'not updating (' + error.message + '): is ckpt serve still running?';
    status.className = 'error';
  } finally {
    loading.delete(id);
  }
}

function showSections(index, container, specs, prefix) {
  const keep = new Set();
  for (const spec of specs) {
    const id = prefix + spec.id;
    keep.add(id);
    const node = figureNode(container, id, spec);
    if (spec.problem) {
      node.querySelector('.body').replaceChildren(element('p', spec.problem, 'error'));
      node.querySelector('.images').replaceChildren();
      node.dataset.version = spec.version;
      node.dataset.steps = '';
      continue;
    }
    if (node.dataset.version !== spec.version && !loading.has(id)) loadSection(index, id, spec, node);
  }
  for (const node of Array.from(container.children)) if (!keep.has(node.id)) node.remove();
}

function show(state) {
  state.stores.forEach((store, index) => {
    const node = storeNode(index, store);
    showTables(index, store, node);
    showSections(index, node.querySelector('.figures'), store.problem ? [] : store.sections, 'store-' + index + '-');
  });
  const overlays = document.getElementById('overlays');
  overlays.hidden = state.overlays.length === 0;
  showSections(0, overlays.querySelector('.figures'), state.overlays, 'all-');
}

async function poll() {
  const status = document.getElementById('status');
  try {
    const answer = await fetch('/state.json', { cache: 'no-store' });
    if (!answer.ok) throw new Error('the server answered ' + answer.status);
    show(await answer.json());
    status.textContent = 'live: checked ' + new Date().toLocaleTimeString();
    status.className = '';
  } catch (error) {
    status.textContent = 'not updating (' + error.message + '): is ckpt serve still running?';
    status.className = 'error';
  }
  setTimeout(poll, POLL_MS);
}

poll();
