// A few lines of test harness shared by the Node client tests (no test framework needed).
// Each case prints `ok - name` or `not ok - name: why`; run.sh counts them. Servers come from
// LOCK_HOST, LOCK_PORT (standalone) and LOCK_CLUSTER (comma-separated master ports).
'use strict';

const HOST = process.env.LOCK_HOST || '127.0.0.1';
const PORT = Number(process.env.LOCK_PORT || 6379);
const CLUSTER = (process.env.LOCK_CLUSTER || '').split(',').filter(Boolean).map(Number);

const cases = [];
function test(name, fn) {
  cases.push([name, fn]);
}

async function run() {
  let failed = 0;
  for (const [name, fn] of cases) {
    try {
      await fn();
      console.log(`ok - ${name}`);
    } catch (e) {
      failed++;
      console.log(`not ok - ${name}: ${e && e.stack ? e.stack.split('\n').slice(0, 4).join('\n    ') : e}`);
    }
  }
  process.exit(failed ? 1 : 0);
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let n = 0;
const unique = (prefix) => `${prefix}:${process.pid}:${Date.now()}:${n++}`;

// `name:value` lines of an INFO section, as numbers where they are numbers.
function parseInfo(text) {
  const out = {};
  for (const line of text.split(/\r?\n/)) {
    const i = line.indexOf(':');
    if (i > 0 && !line.startsWith('#')) {
      const v = line.slice(i + 1);
      out[line.slice(0, i)] = /^-?\d+$/.test(v) ? Number(v) : v;
    }
  }
  return out;
}

module.exports = { HOST, PORT, CLUSTER, test, run, check, sleep, unique, parseInfo };
