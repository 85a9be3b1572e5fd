// Warren status page: lists the groups this edge's admin API shows to the token in the
// field, and keeps them current from each group's live event stream.
//
// Data: GET api/groups every REFRESH_MS (members, counts, and the dispatch counter the rate
// per group is derived from), GET api/tunnels/{id}/health-events once per member (its last
// 50 health transitions), and GET api/groups/{protocol}/{label}~{key}/events per group,
// read with fetch() and a streaming body reader (EventSource cannot send the
// Authorization header). GET api/routes every REFRESH_MS too: the routes held with no member
// (the API shows the admin every one, a tenant its own). Everything is drawn with
// textContent: no HTML is built from data.
'use strict';

(() => {
  const TOKEN_KEY = 'warren.statusToken';
  const REFRESH_MS = 5000;
  const MIN_RATE_MS = 1000; // a rate needs two samples at least this far apart
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const STABLE_MS = 10000; // a stream up this long resets its backoff
  const SILENCE_MS = 90000; // no byte (not even a keep-alive) this long: reconnect
  const HISTORY_LEN = 50;

  const byId = (id) => document.getElementById(id);
  const ui = {
    form: byId('token-form'),
    token: byId('token'),
    forget: byId('forget'),
    status: byId('status'),
    groups: byId('groups'),
    updated: byId('updated'),
    held: byId('held-routes'),
  };
  const region = document.querySelector('meta[name="warren-region"]').content;

  // One session per token: changing the token stops everything of the old one.
  let session = null;

  function start() {
    if (session) stop(session);
    session = {
      token: sessionStorage.getItem(TOKEN_KEY) || '',
      groups: new Map(), // group key → group JSON
      samples: new Map(), // group key → {n: dispatches, t: ms}
      rates: new Map(), // group key → requests per second
      histories: new Map(), // member id → [{at, healthy, reason}]
      loading: new Set(), // member ids whose history is being fetched
      changed: new Map(), // member id → {t: ms, healthy}: its last live event
      streams: new Map(), // group key → stream state
      held: null, // routes held with no member, once read
      heldError: '', // why they could not be read the last time
      loaded: false,
      stopped: false,
      timer: 0,
      refreshing: false,
      again: false,
    };
    ui.token.value = session.token;
    refresh(session);
  }

  function stop(s) {
    s.stopped = true;
    clearTimeout(s.timer);
    for (const st of s.streams.values()) stopStream(st);
    s.streams.clear();
  }

  const live = (s) => s === session && !s.stopped;

  function headers(s) {
    return s.token ? { Authorization: 'Bearer ' + s.token } : {};
  }

  class HTTPError extends Error {
    constructor(status, message, retryAfter) {
      super(message);
      this.status = status;
      this.retryAfter = retryAfter;
    }
  }

  async function getJSON(s, path) {
    const resp = await fetch(path, { headers: headers(s), cache: 'no-store' });
    const body = await resp.json().catch(() => null);
    if (!resp.ok) {
      const msg = (body && body.error) || resp.statusText;
      throw new HTTPError(resp.status, msg, Number(resp.headers.get('Retry-After')) || 0);
    }
    return body;
  }

  const groupKey = (g) => g.protocol + '/' + g.label + '~' + g.key_hash_short;

  // refresh reads every visible group; calls while one runs fold into one more run.
  async function refresh(s) {
    if (s.refreshing) {
      s.again = true;
      return;
    }
    s.refreshing = true;
    clearTimeout(s.timer);
    let next = REFRESH_MS;
    try {
      const asked = performance.now();
      const list = await getJSON(s, 'api/groups?limit=1000');
      if (!live(s)) return;
      await loadHeld(s); // drawn with the groups
      if (!live(s)) return;
      apply(s, list, asked);
      setStatus(s.token ? 'Showing the groups this token may see.'
        : 'This edge\'s API is open: every group is shown.', '');
      ui.updated.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (err) {
      if (!live(s)) return;
      if (err.status === 401) {
        unauthorized(s);
        return;
      }
      if (err.status === 429) next = Math.max(next, err.retryAfter * 1000);
      setStatus('Cannot read the groups: ' + describe(err) + '. Retrying.', 'error');
    } finally {
      s.refreshing = false;
    }
    if (!live(s)) return;
    if (s.again) {
      s.again = false;
      next = 0;
    }
    s.timer = setTimeout(() => refresh(s), next);
  }

  // apply takes a list of groups asked for at the time asked. A live event that arrived
  // meanwhile is newer than the list: it wins.
  function apply(s, list, asked) {
    const now = performance.now();
    const seen = new Set();
    const members = new Set();
    for (const [id, c] of s.changed) if (c.t <= asked) s.changed.delete(id);
    for (const g of list) {
      const key = groupKey(g);
      seen.add(key);
      let newer = false;
      for (const m of g.members) {
        const c = s.changed.get(m.id);
        if (c && c.healthy !== m.healthy) {
          m.healthy = c.healthy;
          newer = true;
        }
      }
      if (newer) g.healthy_count = g.members.filter((m) => m.healthy).length;
      s.groups.set(key, g);
      sampleRate(s, key, g.dispatches, now);
      if (!g.reserved) openStream(s, key, g);
      for (const m of g.members) {
        members.add(m.id);
        if (!s.histories.has(m.id)) loadHistory(s, m.id);
      }
    }
    for (const key of [...s.groups.keys()]) {
      if (seen.has(key)) continue;
      s.groups.delete(key);
      s.samples.delete(key);
      s.rates.delete(key);
      const st = s.streams.get(key);
      if (st) {
        stopStream(st);
        s.streams.delete(key);
      }
    }
    for (const id of [...s.histories.keys()]) if (!members.has(id)) s.histories.delete(id);
    s.loaded = true;
    draw();
  }

  // sampleRate derives a group's dispatch rate from its dispatch counter between refreshes.
  function sampleRate(s, key, n, now) {
    if (typeof n !== 'number') {
      s.samples.delete(key);
      s.rates.delete(key);
      return;
    }
    const prev = s.samples.get(key);
    if (!prev || n < prev.n) {
      s.samples.set(key, { n, t: now });
    } else if (now - prev.t >= MIN_RATE_MS) {
      s.rates.set(key, ((n - prev.n) * 1000) / (now - prev.t));
      s.samples.set(key, { n, t: now });
    }
  }

  // loadHeld reads the routes the token may see and keeps those held with no member: not
  // live, and not a reserved endpoint's (the groups list shows those). A failure is shown in
  // the section; the groups are drawn all the same.
  async function loadHeld(s) {
    try {
      const routes = await getJSON(s, 'api/routes?limit=1000');
      if (!live(s)) return;
      s.held = routes.filter((r) => !r.live && !r.reserved);
      s.heldError = '';
    } catch (err) {
      if (!live(s)) return;
      if (err.status === 401) {
        unauthorized(s);
        return;
      }
      s.heldError = describe(err);
    }
  }

  async function loadHistory(s, id) {
    if (s.loading.has(id)) return;
    s.loading.add(id);
    try {
      const hist = await getJSON(s, 'api/tunnels/' + encodeURIComponent(id) + '/health-events');
      if (live(s)) {
        s.histories.set(id, hist.slice(-HISTORY_LEN));
        draw();
      }
    } catch (err) {
      if (live(s) && err.status === 401) unauthorized(s);
      // 404: the member left meanwhile; the next refresh drops it.
    } finally {
      s.loading.delete(id);
    }
  }

  function unauthorized(s) {
    stop(s);
    s.groups.clear();
    draw();
    if (s.token) {
      setStatus('The token was refused (401 Unauthorized): it is not this edge\'s admin token ' +
        'nor a tenant token. Check it and enter it again.', 'error');
    } else {
      setStatus('This edge needs a token to show its groups: enter the admin token or a tenant ' +
        'token above.', 'warn');
    }
    ui.updated.textContent = 'not updating';
  }

  // Live event streams, one per group.

  function openStream(s, key, g) {
    if (s.streams.has(key)) return;
    const st = {
      path: 'api/groups/' + encodeURIComponent(g.protocol) + '/' +
        encodeURIComponent(g.label + '~' + g.key_hash_short) + '/events',
      backoff: BACKOFF_MIN_MS,
      live: false, // the stream is open
      events: 0, // group events received
      stopped: false,
      abort: null,
      wake: null,
    };
    s.streams.set(key, st);
    runStream(s, key, st);
  }

  // resync reads the groups and the histories of one group's members again.
  function resync(s, key) {
    refresh(s);
    const g = s.groups.get(key);
    if (g) for (const m of g.members) loadHistory(s, m.id);
  }

  function stopStream(st) {
    st.stopped = true;
    if (st.abort) st.abort.abort();
    if (st.wake) st.wake();
  }

  async function runStream(s, key, st) {
    while (live(s) && !st.stopped) {
      const abort = new AbortController();
      st.abort = abort;
      let status = 0;
      let retryAfter = 0;
      let opened = 0;
      try {
        const resp = await fetch(st.path, { headers: headers(s), cache: 'no-store', signal: abort.signal });
        status = resp.status;
        if (resp.ok) {
          opened = Date.now();
          setLive(st, true);
          resync(s, key); // whatever changed before the stream was open
          await readEvents(resp.body, abort, (type, data) => onEvent(s, key, type, data));
        } else {
          retryAfter = Number(resp.headers.get('Retry-After')) || 0;
          if (resp.body) await resp.body.cancel();
        }
      } catch (err) {
        // A network error, or the stream went silent (aborted): reconnect below.
      }
      setLive(st, false);
      if (!live(s) || st.stopped) return;
      if (status === 401) {
        unauthorized(s);
        return;
      }
      // 404: the group is gone or no longer visible; the refresh then stops this stream.
      if (status === 404) refresh(s);
      if (opened && Date.now() - opened >= STABLE_MS) st.backoff = BACKOFF_MIN_MS;
      const wait = Math.max(retryAfter * 1000, st.backoff) * (0.8 + 0.4 * Math.random());
      st.backoff = Math.min(st.backoff * 2, BACKOFF_MAX_MS);
      await new Promise((resolve) => {
        const t = setTimeout(resolve, wait);
        st.wake = () => { clearTimeout(t); resolve(); };
      });
      st.wake = null;
    }
  }

  function setLive(st, on) {
    if (st.live !== on) {
      st.live = on;
      draw();
    }
  }

  // readEvents parses a Server-Sent Events body and calls onEvent(type, data) per event.
  async function readEvents(body, abort, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let silence = setTimeout(() => abort.abort(), SILENCE_MS);
    let buf = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        clearTimeout(silence);
        silence = setTimeout(() => abort.abort(), SILENCE_MS);
        buf = (buf + value).replace(/\r\n/g, '\n'); // the edge sends \n; be lenient
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          let type = 'message';
          const data = [];
          for (const line of block.split('\n')) {
            if (line === '' || line.startsWith(':')) continue; // a comment: keep-alive
            const colon = line.indexOf(':');
            const field = colon < 0 ? line : line.slice(0, colon);
            let value = colon < 0 ? '' : line.slice(colon + 1);
            if (value.startsWith(' ')) value = value.slice(1);
            if (field === 'event') type = value;
            else if (field === 'data') data.push(value);
          }
          if (data.length) onEvent(type, data.join('\n'));
        }
      }
    } finally {
      clearTimeout(silence);
    }
  }

  function onEvent(s, key, type, data) {
    if (!live(s)) return;
    if (type === 'lagged') { // events were dropped: read the group again
      resync(s, key);
      return;
    }
    if (type !== 'group_event') return;
    const st = s.streams.get(key);
    if (st) st.events++;
    let ev;
    try {
      ev = JSON.parse(data);
    } catch {
      return;
    }
    const g = s.groups.get(key);
    const m = g && g.members.find((x) => x.id === ev.tunnel_id);
    if (!m) { // a member that joined since the last refresh
      refresh(s);
      return;
    }
    m.healthy = ev.healthy;
    s.changed.set(m.id, { t: performance.now(), healthy: ev.healthy });
    g.healthy_count = ev.healthy_count;
    g.member_count = ev.member_count;
    const hist = s.histories.get(m.id);
    if (hist) {
      hist.push({ at: ev.at, healthy: ev.healthy, reason: ev.reason });
      if (hist.length > HISTORY_LEN) hist.splice(0, hist.length - HISTORY_LEN);
    }
    draw();
  }

  // Drawing. el() builds elements; strings become text nodes, never HTML.

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) e.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c !== undefined && c !== null && c !== false) e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  let drawPending = false;
  function draw() {
    if (drawPending) return;
    drawPending = true;
    setTimeout(() => {
      drawPending = false;
      render(session);
    }, 0);
  }

  function render(s) {
    const keys = [...s.groups.keys()].sort();
    const out = keys.map((k) => renderGroup(s, k, s.groups.get(k)));
    if (s.loaded && !out.length && !s.stopped) out.push(el('p', { class: 'note' }, 'No load-balancing group is visible.'));
    ui.groups.replaceChildren(...out);
    renderHeld(s);
  }

  function renderHeld(s) {
    const shown = !s.stopped && (s.held !== null || s.heldError !== '');
    ui.held.hidden = !shown;
    if (!shown) {
      ui.held.replaceChildren();
      return;
    }
    const out = [el('h2', null, 'Held routes with no member'),
      el('p', { class: 'note' }, 'Each is kept for its tenant, whose connectors may come back to it, until its claim expires.')];
    if (s.heldError) {
      out.push(el('p', { class: 'note bad' }, 'Cannot read the held routes: ' + s.heldError + '. Retrying.'));
    }
    const held = s.held || [];
    if (held.length) {
      const cols = ['Kind', 'Route', 'Tenant', 'Group', 'Port', 'Claimed', 'Empty since', 'Expires'];
      const when = (at) => (at ? new Date(at).toLocaleString() : '—');
      const rows = held.map((r) => el('tr', { 'data-route': r.kind + '/' + r.label },
        el('td', { 'data-label': 'Kind' }, el('span', { class: 'badge' }, r.kind)),
        el('td', { 'data-label': 'Route' }, el('code', null, r.label)),
        el('td', { 'data-label': 'Tenant' }, r.tenant || '—'),
        el('td', { 'data-label': 'Group' }, r.group || '—'),
        el('td', { 'data-label': 'Port', class: 'num' }, r.port || '—'),
        el('td', { 'data-label': 'Claimed', class: 'nowrap' }, when(r.claimed_at)),
        el('td', { 'data-label': 'Empty since', class: 'nowrap' }, when(r.empty_since)),
        el('td', { 'data-label': 'Expires', class: 'nowrap' }, when(r.expires_at))));
      out.push(el('div', { class: 'table-wrap' }, el('table', { class: 'routes' },
        el('thead', null, el('tr', null, cols.map((c) => el('th', null, c)))),
        el('tbody', null, rows))));
    } else if (s.held) {
      out.push(el('p', { class: 'note' }, 'No route is held without a member.'));
    }
    ui.held.replaceChildren(...out);
  }

  const has = (v) => v !== undefined && v !== null;

  function renderGroup(s, key, g) {
    const ratio = g.healthy_count === g.member_count ? 'ok' : g.healthy_count === 0 ? 'bad' : 'warn';
    const rate = s.rates.get(key);
    const st = s.streams.get(key);
    const section = el('section', {
      class: 'group', 'data-group': key, 'data-live': st ? String(st.live) : null, 'data-events': st ? st.events : null,
    },
      el('h2', null, el('span', { class: 'name' }, g.name), ' ', el('span', { class: 'badge' }, g.protocol),
        g.reserved && [' ', el('span', { class: 'badge warn' }, 'reserved')]),
      el('p', { class: 'meta' }, el('code', { class: 'url' }, g.url),
        ' · ', el('span', { class: 'count ' + ratio }, g.healthy_count + '/' + g.member_count + ' healthy'),
        ' · ', el('span', { class: 'rate', 'data-rate': has(rate) ? rate.toFixed(3) : null },
          has(rate) ? rate.toFixed(1) + ' req/s' : typeof g.dispatches === 'number' ? 'measuring rate…' : 'rate unknown'),
        st && [' · ', st.live ? el('span', { class: 'pill ok' }, 'live')
          : el('span', { class: 'pill warn' }, 'reconnecting…')]));
    if (g.reserved) {
      section.append(el('p', { class: 'note' },
        'Reserved by the edge\'s configuration: no member has registered yet (requests get 503).'));
      return section;
    }
    const weight = g.members.some((m) => has(m.weight));
    const priority = g.members.some((m) => has(m.priority));
    const cols = ['Member', 'Health', 'Draining', 'Active streams', 'Edge', 'Tenant'];
    if (weight) cols.push('Weight');
    if (priority) cols.push('Priority');
    cols.push('Timeline');
    const rows = g.members.map((m) => {
      const cells = [
        el('td', { 'data-label': 'Member' }, el('code', null, m.id), renderWho(m)),
        el('td', { 'data-label': 'Health' },
          el('span', { class: 'pill ' + (m.healthy ? 'ok' : 'bad') }, m.healthy ? 'healthy' : 'unhealthy'),
          m.ejected && [' ', el('span', { class: 'pill bad' }, 'ejected')],
          ' ', el('small', null, m.health_kind), m.ramping && el('small', null, ' · ramping up')),
        el('td', { 'data-label': 'Draining' }, m.draining ? el('span', { class: 'pill warn' }, 'draining') : 'no'),
        el('td', { 'data-label': 'Active streams', class: 'num' }, m.active_streams),
        el('td', { 'data-label': 'Edge', class: 'nowrap' }, m.edge_id || m.edge || region || 'this edge'),
        el('td', { 'data-label': 'Tenant' }, m.tenant || '—'),
      ];
      if (weight) cells.push(el('td', { 'data-label': 'Weight', class: 'num' }, has(m.weight) ? m.weight : '—'));
      if (priority) cells.push(el('td', { 'data-label': 'Priority', class: 'num' }, has(m.priority) ? m.priority : '—'));
      cells.push(el('td', { 'data-label': 'Timeline' }, renderTimeline(s.histories.get(m.id))));
      return el('tr', { 'data-member': m.id, 'data-health': m.healthy ? 'healthy' : 'unhealthy' }, cells);
    });
    section.append(el('div', { class: 'table-wrap' }, el('table', { class: 'members' },
      el('thead', null, el('tr', null, cols.map((c) => el('th', null, c)))),
      el('tbody', null, rows))));
    return section;
  }

  // renderWho is the member's tunnel name and host, which tell the members of a pool apart,
  // and how its connector reaches the edge.
  function renderWho(m) {
    if (!m.name && !m.host && !m.transport) return null;
    return el('small', { class: 'who' },
      m.name && el('span', { class: 'member-name' }, m.name),
      m.name && m.host && ' on ',
      m.host && el('span', { class: 'member-host' }, m.host),
      m.transport && [(m.name || m.host) ? ' · over ' : 'over ',
        el('span', { class: 'member-transport' }, m.transport)]);
  }

  function renderTimeline(hist) {
    if (!hist) return el('small', null, 'loading…');
    const ticks = hist.map((h) => el('span', {
      class: 'tick ' + (h.healthy ? 'ok' : 'bad'),
      title: clock(h.at) + ' ' + (h.healthy ? 'healthy' : 'unhealthy') + ': ' + h.reason,
    }));
    const last = hist[hist.length - 1];
    return [
      el('div', { class: 'timeline', 'data-transitions': hist.length }, ticks),
      last && el('small', { class: 'reason' }, clock(last.at) + ': ' + last.reason),
    ];
  }

  const clock = (at) => new Date(at).toLocaleTimeString();

  function describe(err) {
    if (err instanceof HTTPError) return err.status + ' ' + err.message;
    return 'the edge did not answer (' + err.message + ')';
  }

  function setStatus(text, kind) {
    ui.status.textContent = text;
    ui.status.className = 'status' + (kind ? ' ' + kind : '');
  }

  ui.form.addEventListener('submit', (e) => {
    e.preventDefault();
    const token = ui.token.value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
    start();
  });
  ui.forget.addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    start();
  });
  ui.form.hidden = false;
  start();
})();
