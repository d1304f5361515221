// ioredis 6 against LOCK.*: what docs/clients.md says about it.
//
// Defaults: RESP3 with replyMapping "legacy" (maps as flat arrays), no commandTimeout, and a
// command that was pending when the connection dropped is sent again after the reconnect
// (autoResendUnfulfilledCommands). The safe setting on the connection that sends WAIT: no
// commandTimeout (or one above the WAIT) and retryStrategy: () => null (no reconnect, so a
// dropped connection fails the WAIT instead of sending it again).
'use strict';

const Redis = require('ioredis');
const { HOST, PORT, CLUSTER, test, run, check, sleep, unique, parseInfo } = require('./harness');

const admin = new Redis({ host: HOST, port: PORT });
const lockStats = async () => parseInfo(await admin.info('lock'));

// LOCK.INFO's flat [name, value, ...] reply as an object.
const fields = (flat) => Object.fromEntries(flat.map((v, i) => (i % 2 ? null : [v, flat[i + 1]])).filter(Boolean));

test('acquire, renew, LOCK.INFO (flat array by default), release', async () => {
  const redis = new Redis({ host: HOST, port: PORT });
  const key = unique('ioredis:basic');
  const token = await redis.call('LOCK.ACQUIRE', key, 'worker-1', 30000); // number, or null if busy
  check(Number.isSafeInteger(token) && token > 0, `token ${token}`);
  // RESP3 on the wire by default (HELLO 3), its maps flattened by replyMapping "legacy".
  check(/ resp=3\s*$/.test(await redis.client('INFO')), `the connection speaks RESP3: ${await redis.client('INFO')}`);
  check((await redis.call('LOCK.ACQUIRE', key, 'worker-2', 30000)) === null, 'busy: null');
  check((await redis.call('LOCK.RENEW', key, 'worker-1', 30000)) === 1, 'renew: 1');
  const info = await redis.call('LOCK.INFO', key);
  check(Array.isArray(info) && info.length === 16, `shape ${JSON.stringify(info)}`);
  const f = fields(info);
  check(f.owner === 'worker-1' && f.count === 1 && f.token === token && f.waiters === 0, JSON.stringify(f));
  check(f.ttl > 0 && f.ttl <= 30000, JSON.stringify(f));
  check((await redis.call('LOCK.RELEASE', key, 'worker-1')) === 0, 'release: 0');
  check((await redis.call('LOCK.INFO', key)) === null, 'free: null');
  redis.disconnect();
});

test('replyMapping "resp3": LOCK.INFO is an object, ephemeral, mode and holders included', async () => {
  const redis = new Redis({ host: HOST, port: PORT, replyMapping: 'resp3' });
  const key = unique('ioredis:resp3');
  const token = await redis.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  const info = await redis.call('LOCK.INFO', key);
  check(!Array.isArray(info) && info.owner === 'worker-1' && info.token === token, JSON.stringify(info));
  const names = '["owner","count","ttl","token","ephemeral","waiters","mode","holders"]';
  check(JSON.stringify(Object.keys(info)) === names, JSON.stringify(info));
  check(info.count === 1 && info.ephemeral === null && info.waiters === 0 && info.mode === 'exclusive', JSON.stringify(info));
  check(Array.isArray(info.holders) && info.holders.length === 1, JSON.stringify(info));
  const holder = info.holders[0];
  check(JSON.stringify(Object.keys(holder)) === '["owner","mode","count","ttl","token","ephemeral"]', JSON.stringify(holder));
  check(holder.owner === 'worker-1' && holder.mode === 'exclusive' && holder.token === token && holder.ephemeral === null, JSON.stringify(holder));
  await redis.call('LOCK.RELEASE', key, 'worker-1');
  // An EPHEMERAL hold: ephemeral is the holding connection's client id.
  await redis.call('LOCK.ACQUIRE', key, 'worker-1', 30000, 'EPHEMERAL');
  const id = await redis.client('ID');
  const bound = await redis.call('LOCK.INFO', key);
  check(bound.ephemeral === id && bound.holders[0].ephemeral === id, `${id}: ${JSON.stringify(bound)}`);
  await redis.call('LOCK.RELEASE', key, 'worker-1');
  redis.disconnect();
});

test('WAIT (no commandTimeout, retryStrategy: () => null): granted returns the token, timeout null', async () => {
  const key = unique('ioredis:wait');
  const first = await admin.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  const waiter = new Redis({ host: HOST, port: PORT, retryStrategy: () => null });
  setTimeout(() => admin.call('LOCK.RELEASE', key, 'worker-1'), 300);
  const token = await waiter.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 10000);
  check(typeof token === 'number' && token > first, `token ${token} after ${first}`);
  try {
    check(fields(await waiter.call('LOCK.INFO', key)).owner === 'worker-2', 'worker-2 holds it');
  } finally {
    check((await waiter.call('LOCK.RELEASE', key, 'worker-2')) === 0, 'release');
  }
  const t = Date.now();
  await admin.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  check((await waiter.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 300)) === null, 'timeout: null');
  check(Date.now() - t < 2000, 'on time');
  await admin.call('LOCK.RELEASE', key, 'worker-1');
  waiter.disconnect();
});

test('commandTimeout below the WAIT keeps the connection: the abandoned waiter is granted later', async () => {
  const key = unique('ioredis:abandoned');
  await admin.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  const redis = new Redis({ host: HOST, port: PORT, commandTimeout: 300 });
  const t = Date.now();
  let error = null;
  await redis.call('LOCK.ACQUIRE', key, 'worker-2', 1500, 'WAIT', 10000).catch((e) => (error = e));
  check(error && /timed out/i.test(error.message), `rejected: ${error}`);
  check(Date.now() - t < 1500, 'rejected at the client timeout');
  check(fields(await admin.call('LOCK.INFO', key)).waiters === 1, 'still queued on the server');
  await admin.call('LOCK.RELEASE', key, 'worker-1');
  const f = fields(await admin.call('LOCK.INFO', key));
  check(f.owner === 'worker-2', `granted to the caller that gave up: ${JSON.stringify(f)}`);
  await sleep(1700);
  check((await admin.call('LOCK.INFO', key)) === null, 'held until its 1500 ms lease ended');
  redis.disconnect();
});

test('on a client-side timeout, disconnect: the waiter leaves the queue', async () => {
  const key = unique('ioredis:disconnect');
  await admin.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  const redis = new Redis({ host: HOST, port: PORT, commandTimeout: 300 });
  try {
    await redis.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 10000);
    throw new Error('expected a timeout');
  } catch (e) {
    check(/timed out/i.test(e.message), e.message);
    redis.disconnect(); // the waiter goes with its connection
  }
  await sleep(100);
  check(fields(await admin.call('LOCK.INFO', key)).waiters === 0, 'no waiter left');
  check((await admin.call('LOCK.RELEASE', key, 'worker-1')) === 0, 'free after release');
  check((await admin.call('LOCK.INFO', key)) === null, 'nobody was granted');
});

// A client that gave up on its WAIT (commandTimeout) but kept its connection asks again. On
// another connection, the new request takes the abandoned one's place in the queue and the
// abandoned one is answered with an error, so the lock is not granted to both.
test('a WAIT given up on, asked again on another connection: the retry takes its place (lock_wait_replaced)', async () => {
  const key = unique('ioredis:replaced');
  await admin.call('LOCK.ACQUIRE', key, 'holder', 30000);
  const app = new Redis({ host: HOST, port: PORT, commandTimeout: 300 });
  const error = await app.call('LOCK.ACQUIRE', key, 'app', 30000, 'WAIT', 10000, 'ONCE').then(() => null, (e) => e);
  check(error && /timed out/i.test(error.message), `gave up: ${error}`);
  const other = new Redis({ host: HOST, port: PORT, retryStrategy: () => null });
  const otherGranted = other.call('LOCK.ACQUIRE', key, 'other', 30000, 'WAIT', 10000);
  await sleep(100);
  check(fields(await admin.call('LOCK.INFO', key)).waiters === 2, 'the abandoned request and "other" wait');
  const before = await lockStats();
  const waiting = new Redis({ host: HOST, port: PORT, retryStrategy: () => null });
  const retry = waiting.call('LOCK.ACQUIRE', key, 'app', 30000, 'WAIT', 10000, 'ONCE');
  await sleep(100);
  const after = await lockStats();
  check(after.lock_wait_replaced - before.lock_wait_replaced === 1, 'the abandoned request was replaced');
  check(fields(await admin.call('LOCK.INFO', key)).waiters === 2, 'no third waiter');
  const t = Date.now();
  check((await app.ping()) === 'PONG' && Date.now() - t < 200, 'the abandoned request was answered');
  await admin.call('LOCK.RELEASE', key, 'holder');
  const token = await retry;
  const f = fields(await admin.call('LOCK.INFO', key));
  check(typeof token === 'number' && f.owner === 'app' && f.token === token && f.count === 1, `retry granted: ${JSON.stringify(f)}`);
  check(f.waiters === 1, 'ahead of "other", which still waits');
  check((await waiting.call('LOCK.RELEASE', key, 'app')) === 0, 'one release frees it');
  check((await otherGranted) > token, '"other" is next');
  check(fields(await admin.call('LOCK.INFO', key)).owner === 'other', 'granted to "other", not to the abandoned request');
  await admin.call('LOCK.FORCERELEASE', key);
  for (const c of [app, other, waiting]) c.disconnect();
});

// Asked again on the connection it gave up on, the retry is not read by Redis while the
// abandoned WAIT blocks that connection: it runs once that WAIT is granted, and finds the lock
// held by its own owner. ONCE returns that hold's token without counting; without ONCE the
// retry counts as a re-entry and one release no longer frees the lock.
test('a WAIT given up on, asked again on the same connection: runs after the grant; ONCE does not count it', async () => {
  for (const once of [true, false]) {
    const key = unique('ioredis:same-connection');
    await admin.call('LOCK.ACQUIRE', key, 'holder', 30000);
    const app = new Redis({ host: HOST, port: PORT, commandTimeout: 1000 });
    const args = [key, 'app', 30000, 'WAIT', 10000, ...(once ? ['ONCE'] : [])];
    const error = await app.call('LOCK.ACQUIRE', ...args).then(() => null, (e) => e);
    check(error && /timed out/i.test(error.message), `gave up: ${error}`);
    const before = await lockStats();
    const retry = app.call('LOCK.ACQUIRE', ...args);
    await sleep(100);
    const after = await lockStats();
    check(after.lock_wait_replaced === before.lock_wait_replaced, 'nothing replaced');
    check(fields(await admin.call('LOCK.INFO', key)).waiters === 1, 'one waiter: the abandoned request');
    await admin.call('LOCK.RELEASE', key, 'holder');
    const token = await retry;
    const f = fields(await admin.call('LOCK.INFO', key));
    check(f.owner === 'app' && f.token === token, `the retry answers the abandoned request's hold: ${JSON.stringify(f)}`);
    if (once) {
      check(f.count === 1, `ONCE: count ${f.count}`);
      check((await app.call('LOCK.RELEASE', key, 'app')) === 0, 'ONCE: one release frees it');
    } else {
      check(f.count === 2, `without ONCE: count ${f.count}`);
      check((await app.call('LOCK.RELEASE', key, 'app')) === 1, 'without ONCE: still held after one release');
    }
    await admin.call('LOCK.FORCERELEASE', key);
    app.disconnect();
  }
});

async function killDuringWait(options) {
  const key = unique('ioredis:kill');
  await admin.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  const redis = new Redis({ host: HOST, port: PORT, ...options });
  redis.on('error', () => {});
  const id = await redis.client('ID');
  const before = await lockStats();
  const reply = redis.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 1000).then(
    (v) => ({ v }),
    (e) => ({ e: e.message })
  );
  await sleep(200);
  await admin.client('KILL', 'ID', id);
  const result = await Promise.race([reply, sleep(3000).then(() => 'still pending after 3 s')]);
  const after = await lockStats();
  await admin.call('LOCK.FORCERELEASE', key);
  redis.disconnect();
  return { result, waits: after.lock_waits_started - before.lock_waits_started };
}

test('a dropped connection re-sends the WAIT by default; retryStrategy: () => null fails it instead', async () => {
  const byDefault = await killDuringWait({});
  check(byDefault.waits === 2 && byDefault.result.v === null, `default: ${JSON.stringify(byDefault)}`);
  const noRetry = await killDuringWait({ retryStrategy: () => null });
  check(noRetry.waits === 1 && /closed/.test(noRetry.result.e), `no retry: ${JSON.stringify(noRetry)}`);
  // autoResendUnfulfilledCommands: false drops the pending call: it never settles.
  const noResend = await killDuringWait({ autoResendUnfulfilledCommands: false });
  check(noResend.waits === 1 && noResend.result === 'still pending after 3 s', `no resend: ${JSON.stringify(noResend)}`);
});

// --- cluster ---------------------------------------------------------------------------------

async function nodeStats() {
  const out = {};
  for (const port of CLUSTER) {
    const r = new Redis({ host: HOST, port });
    const errors = parseInfo(await r.info('errorstats'));
    out[port] = Number((/count=(\d+)/.exec(errors.errorstat_MOVED || '') || [0, 0])[1]);
    r.disconnect();
  }
  return out;
}

async function keysOnEveryNode(prefix) {
  const r = new Redis({ host: HOST, port: CLUSTER[0] });
  const ranges = (await r.cluster('SLOTS')).map(([low, high, master]) => [low, high, master[1]]);
  const keys = {};
  for (let i = 0; Object.keys(keys).length < CLUSTER.length; i++) {
    const slot = await r.cluster('KEYSLOT', `${prefix}:${i}`);
    const port = ranges.find(([low, high]) => low <= slot && slot <= high)[2];
    keys[port] ??= `${prefix}:${i}`;
  }
  r.disconnect();
  return keys;
}

test('SHARED and LIMIT: readers share, a semaphore counts permits; LOCK.INFO has no top-level owner', async () => {
  const redis = new Redis({ host: HOST, port: PORT });
  const key = unique('ioredis:shared');
  const t1 = await redis.call('LOCK.ACQUIRE', key, 'reader-1', 30000, 'SHARED');
  const t2 = await redis.call('LOCK.ACQUIRE', key, 'reader-2', 30000, 'SHARED');
  check(typeof t1 === 'number' && t2 > t1, `tokens ${t1} ${t2}`);
  check((await redis.call('LOCK.ACQUIRE', key, 'writer', 30000)) === null, 'writer: null');
  const info = await redis.call('LOCK.INFO', key);
  check(JSON.stringify(info.filter((_, i) => i % 2 === 0)) === '["waiters","mode","holders"]', JSON.stringify(info));
  const holder = info[5][0];
  check(JSON.stringify(holder.filter((_, i) => i % 2 === 0)) === '["owner","mode","count","ttl","token","ephemeral"]', JSON.stringify(holder));
  await redis.call('LOCK.FORCERELEASE', key);
  const sem = unique('ioredis:limit');
  check(typeof (await redis.call('LOCK.ACQUIRE', sem, 'a', 30000, 'LIMIT', 2)) === 'number', 'a');
  check(typeof (await redis.call('LOCK.ACQUIRE', sem, 'b', 30000, 'LIMIT', 2)) === 'number', 'b');
  check((await redis.call('LOCK.ACQUIRE', sem, 'c', 30000, 'LIMIT', 2)) === null, 'c: null');
  check(fields(await redis.call('LOCK.INFO', sem)).limit === 2, 'limit 2');
  await redis.call('LOCK.FORCERELEASE', sem);
  redis.disconnect();
});

test('EPHEMERAL: a silent reconnect drops the hold (PING works, RENEW answers 0)', async () => {
  const redis = new Redis({ host: HOST, port: PORT });
  const key = unique('ioredis:ephemeral');
  check(typeof (await redis.call('LOCK.ACQUIRE', key, 'worker-1', 30000, 'EPHEMERAL')) === 'number', 'token');
  const id = await redis.client('ID');
  check(fields(await redis.call('LOCK.INFO', key)).ephemeral === id, 'bound to this connection');
  await admin.client('KILL', 'ID', id);
  await sleep(300);
  check((await redis.ping()) === 'PONG', 'the client reconnected by itself');
  check((await redis.client('ID')) !== id, 'on a new connection');
  check((await redis.call('LOCK.RENEW', key, 'worker-1', 30000)) === 0, 'RENEW: 0, the hold is gone');
  check((await redis.call('LOCK.INFO', key)) === null, 'free');
  redis.disconnect();
});

test('EPHEMERAL on a dedicated connection without reconnect: its loss is an error, not silence', async () => {
  const holder = new Redis({ host: HOST, port: PORT, retryStrategy: () => null });
  holder.on('error', () => {});
  const key = unique('ioredis:ephemeral-dedicated');
  await holder.call('LOCK.ACQUIRE', key, 'worker-1', 30000, 'EPHEMERAL');
  check((await holder.call('LOCK.RENEW', key, 'worker-1', 30000)) === 1, 'renewed on it');
  await admin.client('KILL', 'ID', await holder.client('ID'));
  await sleep(200);
  const error = await holder.call('LOCK.RENEW', key, 'worker-1', 30000).then(() => null, (e) => e);
  check(error && /closed/i.test(error.message), `the next renewal fails: ${error}`);
  check((await admin.call('LOCK.INFO', key)) === null, 'the hold ended with the connection');
});

test('cluster: LOCK.* goes to an arbitrary node and follows MOVED; results are right', async () => {
  const cluster = new Redis.Cluster([{ host: HOST, port: CLUSTER[0] }]);
  const keys = Object.values(await keysOnEveryNode(unique('ioredis:cluster')));
  const before = await nodeStats();
  for (let round = 0; round < 5; round++) {
    for (const key of keys) {
      const token = await cluster.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
      check(typeof token === 'number', `token ${token}`);
      check(fields(await cluster.call('LOCK.INFO', key)).token === token, 'info');
      check((await cluster.call('LOCK.RELEASE', key, 'worker-1')) === 0, 'release');
    }
  }
  const after = await nodeStats();
  const moved = CLUSTER.reduce((sum, p) => sum + after[p] - before[p], 0);
  check(moved > 0, `some of the 45 commands were redirected: ${moved}`);
  // WAIT through the cluster client.
  const key = keys[1];
  const first = await cluster.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
  setTimeout(() => cluster.call('LOCK.RELEASE', key, 'worker-1'), 300);
  const waiter = new Redis.Cluster([{ host: HOST, port: CLUSTER[0] }]);
  const token = await waiter.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 10000);
  check(token > first, `granted ${token} after ${first}`);
  check((await waiter.call('LOCK.RELEASE', key, 'worker-2')) === 0, 'release');
  cluster.disconnect();
  waiter.disconnect();
});

// A Redis.Cluster keeps one connection per node, so a WAIT sent through it holds up every later
// command of that object to the same node, the release that would end the wait included: the
// release is answered only when the WAIT gives up. cluster.duplicate() for the waits avoids it.
test('cluster: a WAIT holds up its Redis.Cluster\'s later commands to that node; on cluster.duplicate() it does not', async () => {
  const key = Object.values(await keysOnEveryNode(unique('ioredis:cluster-hold-up')))[1];
  const cluster = new Redis.Cluster([{ host: HOST, port: CLUSTER[0] }]);
  const waitAndRelease = async (waiter) => {
    await cluster.call('LOCK.ACQUIRE', key, 'worker-1', 30000);
    const t = Date.now();
    const waited = waiter.call('LOCK.ACQUIRE', key, 'worker-2', 30000, 'WAIT', 1500);
    await sleep(300);
    const released = await cluster.call('LOCK.RELEASE', key, 'worker-1');
    const releasedAt = Date.now() - t;
    const token = await waited;
    await cluster.call('LOCK.FORCERELEASE', key);
    return { released, releasedAt, token };
  };
  const same = await waitAndRelease(cluster);
  check(same.token === null, `the WAIT on the same object timed out: ${JSON.stringify(same)}`);
  check(same.released === 0, `the release freed the lock only after the wait gave up: ${JSON.stringify(same)}`);
  check(same.releasedAt >= 1400, `the release waited for the WAIT: ${same.releasedAt} ms`);
  const waiter = cluster.duplicate();
  const other = await waitAndRelease(waiter);
  check(other.released === 0 && other.releasedAt < 1000, `the release was answered at once: ${JSON.stringify(other)}`);
  check(typeof other.token === 'number', `the WAIT on the duplicate was granted: ${JSON.stringify(other)}`);
  waiter.disconnect();
  cluster.disconnect();
});

run().finally(() => admin.disconnect());
