<?php
// phpredis (the redis extension) against LOCK.*: what docs/clients.md says about it.
//
// Defaults: RESP2; nil and errors come back as false (getLastError() has the error); the read
// timeout is PHP's default_socket_timeout (60 s), and a read that times out leaves the connection
// open: the waiter stays queued, the server may grant it, and the grant is the reply the next
// command on that connection reads. The safe setting: setOption(Redis::OPT_READ_TIMEOUT, -1)
// (or a timeout above the WAIT), and close() after any client-side timeout. In a cluster,
// rawCommand takes the key first and goes straight to its node.
require __DIR__ . '/harness.php';

function client(): Redis
{
    global $HOST, $PORT;
    $redis = new Redis();
    $redis->connect($HOST, $PORT);
    return $redis;
}

test('main', 'acquire, renew, LOCK.INFO (flat array), release; nil and errors are false', function () {
    $redis = client();
    $key = unique('phpredis:basic');
    $token = $redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000); // int, or false if busy
    check(is_int($token) && $token > 0, "token $token");
    check($redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000) === false, 'busy: false');
    check($redis->rawCommand('LOCK.RENEW', $key, 'worker-1', 30000) === 1, 'renew');
    $info = fields($redis->rawCommand('LOCK.INFO', $key));
    check($info['owner'] === 'worker-1' && $info['count'] === 1 && $info['token'] === $token && $info['waiters'] === 0, json_encode($info));
    check($redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 0) === false, 'an error is false too');
    check(str_starts_with($redis->getLastError(), 'ERR lease'), 'getLastError() has it');
    check($redis->rawCommand('LOCK.RELEASE', $key, 'worker-1') === 0, 'release');
    check($redis->rawCommand('LOCK.INFO', $key) === false, 'free: false');
});

test('main', 'WAIT (OPT_READ_TIMEOUT -1): granted returns the token, timeout false', function () {
    $key = unique('phpredis:wait');
    $admin = client();
    $first = $admin->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 300); // lease ends in 0.3 s
    $waiter = client();
    $waiter->setOption(Redis::OPT_READ_TIMEOUT, -1);
    $token = $waiter->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 10000);
    check(is_int($token) && $token > $first, "granted $token after $first");
    try {
        check(fields($waiter->rawCommand('LOCK.INFO', $key))['owner'] === 'worker-2', 'worker-2 holds it');
    } finally {
        check($waiter->rawCommand('LOCK.RELEASE', $key, 'worker-2') === 0, 'release');
    }
    $admin->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000);
    $t = microtime(true);
    check($waiter->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 300) === false, 'false');
    check(microtime(true) - $t < 2, 'on time');
    $admin->rawCommand('LOCK.RELEASE', $key, 'worker-1');
});

test('main', 'a read timeout keeps the connection; close() after it makes the waiter leave the queue', function () {
    $key = unique('phpredis:close');
    $admin = client();
    $admin->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000);
    $redis = client();
    $redis->setOption(Redis::OPT_READ_TIMEOUT, 0.5);
    try {
        $redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 10000);
        throw new RuntimeException('expected a RedisException');
    } catch (RedisException $e) {
        // "socket error on read socket"
    }
    usleep(100000);
    check(fields($admin->rawCommand('LOCK.INFO', $key))['waiters'] === 1, 'still queued after the timeout');
    $redis->close();
    usleep(100000);
    check(fields($admin->rawCommand('LOCK.INFO', $key))['waiters'] === 0, 'gone after close()');
    check($admin->rawCommand('LOCK.RELEASE', $key, 'worker-1') === 0, 'release');
    check($admin->rawCommand('LOCK.INFO', $key) === false, 'nobody was granted');
});

test('default-timeout', 'defaults: a WAIT over 60 s fails at 60 s; the waiter is granted later and the next command reads that stale token', function () {
    $key = unique('phpredis:default');
    $admin = client();
    $admin->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 61000); // handed over at 61 s
    $redis = client();
    $t = microtime(true);
    try {
        $redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 90000);
        throw new RuntimeException('expected a RedisException');
    } catch (RedisException $e) {
        check(str_contains($e->getMessage(), 'socket error on read socket'), $e->getMessage());
    }
    $elapsed = microtime(true) - $t;
    check($elapsed > 59 && $elapsed < 61, "failed after $elapsed s");
    usleep(1500000); // the lease ends; the abandoned waiter is granted
    $info = fields($admin->rawCommand('LOCK.INFO', $key));
    check($info['owner'] === 'worker-2', 'granted to the caller that gave up: ' . json_encode($info));
    $reply = $redis->rawCommand('PING');
    check($reply === $info['token'], 'PING read the stale grant: ' . json_encode($reply));
    $admin->rawCommand('LOCK.FORCERELEASE', $key);
});

test('no-timeout', 'OPT_READ_TIMEOUT -1: a WAIT is answered after more than 60 s', function () {
    $key = unique('phpredis:no-timeout');
    $admin = client();
    $first = $admin->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 61000); // handed over at 61 s
    $redis = client();
    $redis->setOption(Redis::OPT_READ_TIMEOUT, -1);
    $t = microtime(true);
    $token = $redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 90000);
    $elapsed = microtime(true) - $t;
    check(is_int($token) && $token > $first, "granted $token after $first");
    check($elapsed > 60.5, "after $elapsed s");
    $admin->rawCommand('LOCK.FORCERELEASE', $key);
});

// EPHEMERAL: a Redis object closes its connection when it is destroyed (out of scope, unset, the
// end of the script or request), and by default (OPT_MAX_RETRIES 10) reconnects silently after a
// drop. The dedicated pattern: one Redis object kept referenced for as long as the hold lives,
// renewals on it, OPT_MAX_RETRIES 0 so a drop throws instead of reconnecting.
function scoped_ephemeral(string $key): void
{
    client()->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000, 'EPHEMERAL');
}

test('main', 'EPHEMERAL: renewals on a dedicated Redis (OPT_MAX_RETRIES 0) keep the hold; its drop throws', function () {
    $admin = client();
    $holder = client();
    $holder->setOption(Redis::OPT_MAX_RETRIES, 0);
    $key = unique('phpredis:ephemeral');
    $holder->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000, 'EPHEMERAL');
    $id = $holder->rawCommand('CLIENT', 'ID');
    for ($i = 0; $i < 3; $i++) {
        usleep(200000);
        check($holder->rawCommand('LOCK.RENEW', $key, 'worker-1', 30000) === 1, 'renewed');
    }
    check(fields($admin->rawCommand('LOCK.INFO', $key))['ephemeral'] === $id, 'held on the holder\'s connection');
    $admin->rawCommand('CLIENT', 'KILL', 'ID', $id);
    usleep(100000);
    check($admin->rawCommand('LOCK.INFO', $key) === false, 'gone with the connection');
    try {
        $holder->rawCommand('LOCK.RENEW', $key, 'worker-1', 30000);
        throw new RuntimeException('expected the renewal to throw');
    } catch (RedisException $e) {
        check($e->getMessage() === 'Connection lost', $e->getMessage());
    }
});

test('main', 'EPHEMERAL with the defaults: a drop reconnects silently; a Redis object out of scope ends the hold', function () {
    $admin = client();
    $redis = client();
    check($redis->getOption(Redis::OPT_MAX_RETRIES) === 10, 'OPT_MAX_RETRIES 10 by default');
    $key = unique('phpredis:ephemeral-default');
    $redis->rawCommand('LOCK.ACQUIRE', $key, 'worker-1', 30000, 'EPHEMERAL');
    $id = $redis->rawCommand('CLIENT', 'ID');
    $admin->rawCommand('CLIENT', 'KILL', 'ID', $id);
    usleep(100000);
    check($redis->rawCommand('LOCK.RENEW', $key, 'worker-1', 30000) === 0, 'no error: the renewal ran on a new connection, 0');
    check($redis->rawCommand('CLIENT', 'ID') !== $id, 'a new connection');
    $key = unique('phpredis:ephemeral-scoped');
    scoped_ephemeral($key);
    usleep(100000);
    check($admin->rawCommand('LOCK.INFO', $key) === false, 'the object went out of scope, its connection closed: the hold is gone');
});

function moved_total(): int
{
    global $HOST, $CLUSTER;
    $sum = 0;
    foreach ($CLUSTER as $port) {
        $node = new Redis();
        $node->connect($HOST, $port);
        $sum += moved_count($node->rawCommand('INFO', 'errorstats'));
    }
    return $sum;
}

test('main', "cluster: rawCommand(\$key, ...) goes straight to the key's node, WAIT included", function () {
    global $HOST, $CLUSTER;
    $cluster = new RedisCluster(null, ["$HOST:{$CLUSTER[0]}"]);
    $cluster->setOption(Redis::OPT_READ_TIMEOUT, -1);
    $before = moved_total();
    $prefix = unique('phpredis:cluster');
    for ($i = 0; $i < 10; $i++) {
        $key = "$prefix:$i";
        $token = $cluster->rawCommand($key, 'LOCK.ACQUIRE', $key, 'worker-1', 30000);
        check(is_int($token), "token $token");
        check(fields($cluster->rawCommand($key, 'LOCK.INFO', $key))['token'] === $token, 'info');
        check($cluster->rawCommand($key, 'LOCK.RENEW', $key, 'worker-1', 30000) === 1, 'renew');
        check($cluster->rawCommand($key, 'LOCK.RELEASE', $key, 'worker-1') === 0, 'release');
    }
    $key = "$prefix:wait";
    $first = $cluster->rawCommand($key, 'LOCK.ACQUIRE', $key, 'worker-1', 300);
    $token = $cluster->rawCommand($key, 'LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 10000);
    check(is_int($token) && $token > $first, "granted $token after $first");
    check($cluster->rawCommand($key, 'LOCK.RELEASE', $key, 'worker-2') === 0, 'release');
    check(moved_total() === $before, 'no MOVED');
});

run_cases();
