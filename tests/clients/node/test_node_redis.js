// node-redis 6 against LOCK.*: what docs/clients.md says about it.
//
// Defaults: RESP3 (LOCK.INFO is an object), no socket timeout; arguments must be strings; a
// command pending when the connection drops is rejected, not sent again. In a cluster, pass the
// lock key as sendCommand's firstKey so the command goes straight to the key's node.
'use strict';

const { createClient, createClientPool, createCluster } = require('redis');
const { HOST, PORT, CLUSTER, test, run, check, sleep, unique, parseInfo } = require('./harness');

const url = `redis://${HOST}:${PORT}`;
let admin;
const lockStats = async () => parseInfo(await admin.sendCommand(['INFO', 'lock']));

test('acquire, renew, LOCK.INFO (object under RESP3, the default), release', async () => {
  const client = await createClient({ url }).connect();
  const key = unique('node-redis:basic');
  const token = await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']); // number or null
  check(Number.isSafeInteger(token) && token > 0, `token ${token}`);
  check((await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000'])) === null, 'busy: null');
  check((await client.sendCommand(['LOCK.RENEW', key, 'worker-1', '30000'])) === 1, 'renew: 1');
  const info = await client.sendCommand(['LOCK.INFO', key]);
  check(!Array.isArray(info) && info.owner === 'worker-1' && info.count === 1, JSON.stringify(info));
  check(info.token === token && info.waiters === 0 && info.ttl > 0 && info.ttl <= 30000, JSON.stringify(info));
  const names = '["owner","count","ttl","token","ephemeral","waiters","mode","holders"]';
  check(JSON.stringify(Object.keys(info)) === names && info.ephemeral === null && info.mode === 'exclusive', JSON.stringify(info));
  check((await client.sendCommand(['LOCK.RELEASE', key, 'worker-1'])) === 0, 'release: 0');
  check((await client.sendCommand(['LOCK.INFO', key])) === null, 'free: null');
  let error = null;
  try {
    await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', 30000]);
  } catch (e) {
    error = e;
  }
  check(error instanceof TypeError, `a number argument is refused: ${error}`);
  await client.close();
});

test('RESP: 2: LOCK.INFO is a flat array', async () => {
  const client = await createClient({ url, RESP: 2 }).connect();
  const key = unique('node-redis:resp2');
  const token = await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const info = await client.sendCommand(['LOCK.INFO', key]);
  check(Array.isArray(info) && info.length === 16 && info[0] === 'owner' && info[1] === 'worker-1', JSON.stringify(info));
  check(info[6] === 'token' && info[7] === token, JSON.stringify(info));
  await client.sendCommand(['LOCK.RELEASE', key, 'worker-1']);
  await client.close();
});

test('WAIT with defaults: granted returns the token, timeout returns null', async () => {
  const key = unique('node-redis:wait');
  const first = await admin.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const waiter = await createClient({ url }).connect();
  setTimeout(() => admin.sendCommand(['LOCK.RELEASE', key, 'worker-1']), 300);
  const token = await waiter.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '10000']);
  check(typeof token === 'number' && token > first, `token ${token} after ${first}`);
  try {
    check((await waiter.sendCommand(['LOCK.INFO', key])).owner === 'worker-2', 'worker-2 holds it');
  } finally {
    check((await waiter.sendCommand(['LOCK.RELEASE', key, 'worker-2'])) === 0, 'release');
  }
  await admin.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const t = Date.now();
  check((await waiter.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '300'])) === null, 'null');
  check(Date.now() - t < 2000, 'on time');
  await admin.sendCommand(['LOCK.RELEASE', key, 'worker-1']);
  await waiter.close();
});

test('socketTimeout below the WAIT closes the client for good; the waiter leaves the queue', async () => {
  const key = unique('node-redis:socket-timeout');
  await admin.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const client = createClient({ url, socket: { socketTimeout: 300 } });
  client.on('error', () => {});
  await client.connect();
  let error = null;
  await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '10000']).catch((e) => (error = e));
  check(error && error.constructor.name === 'SocketTimeoutError', `rejected: ${error && error.constructor.name}: ${error}`);
  await sleep(200);
  check(!client.isOpen, 'the client is closed');
  const later = await client.ping().then(() => null, (e) => e);
  check(later && later.constructor.name === 'ClientClosedError', `for good: ${later}`);
  check((await admin.sendCommand(['LOCK.INFO', key])).waiters === 0, 'no waiter left');
  check((await admin.sendCommand(['LOCK.RELEASE', key, 'worker-1'])) === 0, 'release');
  check((await admin.sendCommand(['LOCK.INFO', key])) === null, 'nobody was granted');
});

test('a dropped connection fails the pending WAIT; it is not sent again', async () => {
  const key = unique('node-redis:kill');
  await admin.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const client = createClient({ url });
  client.on('error', () => {});
  await client.connect();
  const id = await client.sendCommand(['CLIENT', 'ID']);
  const before = await lockStats();
  const reply = client.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '1000']).then(
    (v) => ({ v }),
    (e) => ({ e: e.message })
  );
  await sleep(200);
  await admin.sendCommand(['CLIENT', 'KILL', 'ID', String(id)]);
  const result = await Promise.race([reply, sleep(3000).then(() => 'pending')]);
  const after = await lockStats();
  check(result.e, `rejected: ${JSON.stringify(result)}`);
  check(after.lock_waits_started - before.lock_waits_started === 1, 'sent once');
  await admin.sendCommand(['LOCK.FORCERELEASE', key]);
  await client.close().catch(() => {});
});

// --- cluster ---------------------------------------------------------------------------------

async function movedPerNode() {
  const out = {};
  for (const port of CLUSTER) {
    const c = await createClient({ url: `redis://${HOST}:${port}` }).connect();
    const errors = parseInfo(await c.sendCommand(['INFO', 'errorstats']));
    out[port] = Number((/count=(\d+)/.exec(errors.errorstat_MOVED || '') || [0, 0])[1]);
    await c.close();
  }
  return out;
}

async function keysOnEveryNode(prefix) {
  const c = await createClient({ url: `redis://${HOST}:${CLUSTER[0]}`, RESP: 2 }).connect();
  const ranges = (await c.sendCommand(['CLUSTER', 'SLOTS'])).map(([low, high, master]) => [low, high, master[1]]);
  const keys = [];
  const seen = new Set();
  for (let i = 0; seen.size < CLUSTER.length; i++) {
    const slot = await c.sendCommand(['CLUSTER', 'KEYSLOT', `${prefix}:${i}`]);
    const port = ranges.find(([low, high]) => low <= slot && slot <= high)[2];
    if (!seen.has(port)) {
      seen.add(port);
      keys.push(`${prefix}:${i}`);
    }
  }
  await c.close();
  return keys;
}

test('SHARED and LIMIT: readers share, a semaphore counts permits; LOCK.INFO has no top-level owner', async () => {
  const client = await createClient({ url }).connect();
  const key = unique('node-redis:shared');
  const t1 = await client.sendCommand(['LOCK.ACQUIRE', key, 'reader-1', '30000', 'SHARED']);
  const t2 = await client.sendCommand(['LOCK.ACQUIRE', key, 'reader-2', '30000', 'SHARED']);
  check(typeof t1 === 'number' && t2 > t1, `tokens ${t1} ${t2}`);
  check((await client.sendCommand(['LOCK.ACQUIRE', key, 'writer', '30000'])) === null, 'writer: null');
  const info = await client.sendCommand(['LOCK.INFO', key]);
  check(info.mode === 'shared' && !('owner' in info) && info.holders.length === 2, JSON.stringify(info));
  check(JSON.stringify(Object.keys(info.holders[0])) === '["owner","mode","count","ttl","token","ephemeral"]', JSON.stringify(info));
  await client.sendCommand(['LOCK.FORCERELEASE', key]);
  const sem = unique('node-redis:limit');
  check(typeof (await client.sendCommand(['LOCK.ACQUIRE', sem, 'a', '30000', 'LIMIT', '2'])) === 'number', 'a');
  check(typeof (await client.sendCommand(['LOCK.ACQUIRE', sem, 'b', '30000', 'LIMIT', '2'])) === 'number', 'b');
  check((await client.sendCommand(['LOCK.ACQUIRE', sem, 'c', '30000', 'LIMIT', '2'])) === null, 'c: null');
  const semInfo = await client.sendCommand(['LOCK.INFO', sem]);
  check(semInfo.mode === 'semaphore' && semInfo.limit === 2, JSON.stringify(semInfo));
  await client.sendCommand(['LOCK.FORCERELEASE', sem]);
  await client.close();
});

test('EPHEMERAL: a silent reconnect drops the hold (PING works, RENEW answers 0); the client emits error and reconnecting', async () => {
  const client = createClient({ url });
  const events = [];
  client.on('error', (e) => events.push(`error: ${e.message}`));
  client.on('reconnecting', () => events.push('reconnecting'));
  await client.connect();
  const key = unique('node-redis:ephemeral');
  check(typeof (await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000', 'EPHEMERAL'])) === 'number', 'token');
  const id = await client.sendCommand(['CLIENT', 'ID']);
  check((await client.sendCommand(['LOCK.INFO', key])).ephemeral === id, 'bound to this connection');
  await admin.sendCommand(['CLIENT', 'KILL', 'ID', String(id)]);
  await sleep(300);
  check(events[0] === 'error: Socket closed unexpectedly' && events[1] === 'reconnecting', `at the drop, before any command: ${events}`);
  check((await client.ping()) === 'PONG', 'the client reconnected by itself');
  check((await client.sendCommand(['LOCK.RENEW', key, 'worker-1', '30000'])) === 0, 'RENEW: 0, the hold is gone');
  check((await client.sendCommand(['LOCK.INFO', key])) === null, 'free');
  await client.close();
});

// The dedicated connection with reconnectStrategy: false: the drop closes the client for good, so
// the holder's next renewal rejects (ClientClosedError) instead of answering on a new connection.
test('EPHEMERAL on a client with reconnectStrategy: false: the drop closes it, the next renewal rejects', async () => {
  const holder = createClient({ url, socket: { reconnectStrategy: false } });
  const errors = [];
  holder.on('error', (e) => errors.push(e.message));
  await holder.connect();
  const key = unique('node-redis:ephemeral-no-reconnect');
  await holder.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000', 'EPHEMERAL']);
  check((await holder.sendCommand(['LOCK.RENEW', key, 'worker-1', '30000'])) === 1, 'renewed on it');
  await admin.sendCommand(['CLIENT', 'KILL', 'ID', String(await holder.sendCommand(['CLIENT', 'ID']))]);
  await sleep(300);
  check(errors.join() === 'Socket closed unexpectedly' && !holder.isOpen, `closed: ${errors} ${holder.isOpen}`);
  const error = await holder.sendCommand(['LOCK.RENEW', key, 'worker-1', '30000']).then(() => null, (e) => e);
  check(error && error.constructor.name === 'ClientClosedError', `the next renewal rejects: ${error}`);
  check((await admin.sendCommand(['LOCK.INFO', key])) === null, 'the hold ended with the connection');
});

// createClientPool (defaults: minimum 1, cleanupDelay 3000) hands each command to whichever of
// its clients is free, opening more while all are busy, and 3 s after the last one comes back
// idle it closes the idle clients above its minimum: the EPHEMERAL holds taken on them end.
// Here four tasks each keep a pooled client for 300 ms, so the pool opens four and each hold is
// on a client of its own; which three clients it closes is the pool's choice.
test('EPHEMERAL through createClientPool: the pool closes its idle clients after 3 s, and their holds end', async () => {
  const pool = createClientPool({ url });
  pool.on('error', () => {});
  await pool.connect();
  const keys = [0, 1, 2, 3].map((i) => unique(`node-redis:pool-${i}`));
  const t = Date.now();
  await Promise.all(
    keys.map((key) =>
      pool.execute(async (client) => {
        await client.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000', 'EPHEMERAL']);
        await sleep(300);
      })
    )
  );
  check(pool.totalClients === 4, `four clients: ${pool.totalClients}`);
  const bound = [];
  for (const key of keys) bound.push((await admin.sendCommand(['LOCK.INFO', key])).ephemeral);
  check(new Set(bound).size === 4, `one hold per client: ${bound}`);
  const heldKeys = async () => {
    const out = [];
    for (const key of keys) if ((await admin.sendCommand(['LOCK.INFO', key])) !== null) out.push(key);
    return out;
  };
  await sleep(2000);
  check((await heldKeys()).length === 4, 'all four held 2 s after the last command');
  let left = keys;
  while (left.length > 1 && Date.now() - t < 7000) {
    await sleep(100);
    left = await heldKeys();
  }
  const lostAt = Date.now() - t;
  check(left.length === 1 && lostAt >= 3200, `three holds lost at ${lostAt} ms: ${left.length} left`);
  check(pool.totalClients === 1, `the pool kept one client: ${pool.totalClients}`);
  const kept = await pool.sendCommand(['CLIENT', 'ID']);
  check(kept === bound[keys.indexOf(left[0])], `the hold left is on the client kept (${kept}): ${bound}`);
  check((await pool.sendCommand(['LOCK.RELEASE', left[0], 'worker-1'])) === 0, 'release');
  await pool.close();
});

test('a WAIT holds up every other command of its client; on client.duplicate() it does not', async () => {
  const key = unique('node-redis:wait-blocks');
  await admin.sendCommand(['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  const client = await createClient({ url }).connect();
  const waiting = client.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '1000']);
  await sleep(50);
  let t = Date.now();
  await client.ping();
  const blocked = Date.now() - t;
  check((await waiting) === null, 'the WAIT timed out');
  check(blocked >= 800, `PING waited behind the WAIT: ${blocked} ms`);
  const waiter = await client.duplicate().connect();
  const waited = waiter.sendCommand(['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '1000']);
  await sleep(50);
  t = Date.now();
  await client.ping();
  const free = Date.now() - t;
  check((await waited) === null, 'the WAIT timed out');
  check(free < 500, `PING answered at once: ${free} ms`);
  await admin.sendCommand(['LOCK.RELEASE', key, 'worker-1']);
  await waiter.close();
  await client.close();
});

test('cluster: sendCommand(key, false, [...]) goes straight to the key\'s node, WAIT included', async () => {
  const keys = await keysOnEveryNode(unique('node-redis:cluster'));
  const before = await movedPerNode();
  const cluster = createCluster({ rootNodes: [{ url: `redis://${HOST}:${CLUSTER[0]}` }] });
  await cluster.connect();
  for (const key of keys) {
    const token = await cluster.sendCommand(key, false, ['LOCK.ACQUIRE', key, 'worker-1', '30000']);
    check(typeof token === 'number', `token ${token}`);
    check((await cluster.sendCommand(key, true, ['LOCK.INFO', key])).token === token, 'info');
    check((await cluster.sendCommand(key, false, ['LOCK.RENEW', key, 'worker-1', '30000'])) === 1, 'renew');
    check((await cluster.sendCommand(key, false, ['LOCK.RELEASE', key, 'worker-1'])) === 0, 'release');
  }
  const key = keys[1];
  const first = await cluster.sendCommand(key, false, ['LOCK.ACQUIRE', key, 'worker-1', '30000']);
  setTimeout(() => cluster.sendCommand(key, false, ['LOCK.RELEASE', key, 'worker-1']), 300);
  const waiter = await createCluster({ rootNodes: [{ url: `redis://${HOST}:${CLUSTER[0]}` }] }).connect();
  const token = await waiter.sendCommand(key, false, ['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '10000']);
  check(token > first, `granted ${token} after ${first}`);
  check((await waiter.sendCommand(key, false, ['LOCK.RELEASE', key, 'worker-2'])) === 0, 'release');
  const after = await movedPerNode();
  for (const port of CLUSTER) check(after[port] === before[port], `no MOVED on ${port}`);
  await cluster.close();
  await waiter.close();
});

// A cluster object keeps one connection per node, so a WAIT sent through it holds up every later
// command of that object to the same node, the release that would end the wait included: the
// release is answered only when the WAIT gives up. A second cluster object
// (cluster.duplicate().connect()) for the waits avoids it.
test('cluster: a WAIT holds up its cluster object\'s later commands to that node; on cluster.duplicate() it does not', async () => {
  const key = (await keysOnEveryNode(unique('node-redis:cluster-hold-up')))[1];
  const cluster = await createCluster({ rootNodes: [{ url: `redis://${HOST}:${CLUSTER[0]}` }] }).connect();
  const waitAndRelease = async (waiter) => {
    await cluster.sendCommand(key, false, ['LOCK.ACQUIRE', key, 'worker-1', '30000']);
    const t = Date.now();
    const waited = waiter.sendCommand(key, false, ['LOCK.ACQUIRE', key, 'worker-2', '30000', 'WAIT', '1500']);
    await sleep(300);
    const released = await cluster.sendCommand(key, false, ['LOCK.RELEASE', key, 'worker-1']);
    const releasedAt = Date.now() - t;
    const token = await waited;
    await cluster.sendCommand(key, false, ['LOCK.FORCERELEASE', key]);
    return { released, releasedAt, token };
  };
  const same = await waitAndRelease(cluster);
  check(same.token === null, `the WAIT on the same object timed out: ${JSON.stringify(same)}`);
  check(same.released === 0, `the release freed the lock only after the wait gave up: ${JSON.stringify(same)}`);
  check(same.releasedAt >= 1400, `the release waited for the WAIT: ${same.releasedAt} ms`);
  const waiter = await cluster.duplicate().connect();
  const other = await waitAndRelease(waiter);
  check(other.released === 0 && other.releasedAt < 1000, `the release was answered at once: ${JSON.stringify(other)}`);
  check(typeof other.token === 'number', `the WAIT on the duplicate was granted: ${JSON.stringify(other)}`);
  await waiter.close();
  await cluster.close();
});

test('cluster: LOCK.INFO, LOCK.LEADER and LOCK.CHECK are the read-only LOCK.* commands (isReadonly true)', async () => {
  const key = (await keysOnEveryNode(unique('node-redis:cluster-readonly')))[2];
  const cluster = await createCluster({ rootNodes: [{ url: `redis://${HOST}:${CLUSTER[0]}` }] }).connect();
  const c = await createClient({ url: `redis://${HOST}:${CLUSTER[0]}`, RESP: 2 }).connect();
  const readonly = (await c.sendCommand(['COMMAND']))
    .filter(([name, , flags]) => String(name).startsWith('lock.') && flags.includes('readonly'))
    .map(([name]) => String(name))
    .sort();
  await c.close();
  check(JSON.stringify(readonly) === '["lock.check","lock.info","lock.leader"]', `read-only: ${readonly}`);
  const before = await movedPerNode();
  check((await cluster.sendCommand(key, true, ['LOCK.LEADER', key])) === null, 'nobody leads');
  const epoch = await cluster.sendCommand(key, false, ['LOCK.CAMPAIGN', key, 'candidate-1', '30000']);
  const leader = await cluster.sendCommand(key, true, ['LOCK.LEADER', key]);
  check(leader[0] === 'candidate-1' && leader[1] === epoch, JSON.stringify(leader));
  check((await cluster.sendCommand(key, true, ['LOCK.INFO', key])).owner === 'candidate-1', 'info');
  check((await cluster.sendCommand(key, true, ['LOCK.CHECK', key, 'candidate-1', String(epoch)])) === 1, 'check');
  const after = await movedPerNode();
  for (const port of CLUSTER) check(after[port] === before[port], `no MOVED on ${port}`);
  await cluster.sendCommand(key, false, ['LOCK.FORCERELEASE', key]);
  await cluster.close();
});

(async () => {
  admin = await createClient({ url }).connect();
  await run();
})();
