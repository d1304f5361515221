<?php
// predis 1.1 against LOCK.*: what docs/clients.md says about it.
//
// Defaults: RESP2; no read_write_timeout, so PHP's default_socket_timeout (60 s) bounds every
// read: a WAIT over 60 s, or WAIT 0, fails at 60 s (the connection is closed, the waiter leaves
// the queue). The safe setting: 'read_write_timeout' => 0 (no timeout) or above the WAIT. A
// cluster client refuses LOCK.* until each command gets a key handler.
require __DIR__ . '/harness.php';
require 'Predis/Autoloader.php'; // Debian's php-predis, on the include path
Predis\Autoloader::register();

function client(array $options = []): Predis\Client
{
    global $HOST, $PORT;
    return new Predis\Client(['host' => $HOST, 'port' => $PORT] + $options);
}

test('main', 'acquire, renew, LOCK.INFO (flat array), release; executeRaw', function () {
    $redis = client();
    $key = unique('predis:basic');
    $token = $redis->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 30000]); // int, or null if busy
    check(is_int($token) && $token > 0, "token $token");
    check($redis->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000]) === null, 'busy: null');
    check($redis->executeRaw(['LOCK.RENEW', $key, 'worker-1', 30000]) === 1, 'renew');
    $info = fields($redis->executeRaw(['LOCK.INFO', $key]));
    check($info['owner'] === 'worker-1' && $info['count'] === 1 && $info['token'] === $token && $info['waiters'] === 0, json_encode($info));
    $reply = $redis->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 0], $error);
    check($error === true && str_starts_with($reply, 'ERR lease'), "an error is a string with \$error set: $reply");
    check($redis->executeRaw(['LOCK.RELEASE', $key, 'worker-1']) === 0, 'release');
    check($redis->executeRaw(['LOCK.INFO', $key]) === null, 'free');
});

test('main', 'WAIT (read_write_timeout 0): granted returns the token, timeout null', function () {
    $key = unique('predis:wait');
    $admin = client();
    $first = $admin->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 300]); // lease ends in 0.3 s
    $waiter = client(['read_write_timeout' => 0]);
    $token = $waiter->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 10000]);
    check(is_int($token) && $token > $first, "granted $token after $first");
    try {
        check(fields($waiter->executeRaw(['LOCK.INFO', $key]))['owner'] === 'worker-2', 'worker-2 holds it');
    } finally {
        check($waiter->executeRaw(['LOCK.RELEASE', $key, 'worker-2']) === 0, 'release');
    }
    $admin->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 30000]);
    $t = microtime(true);
    check($waiter->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 300]) === null, 'null');
    check(microtime(true) - $t < 2, 'on time');
    $admin->executeRaw(['LOCK.RELEASE', $key, 'worker-1']);
});

test('default-timeout', 'defaults: WAIT 0 fails at 60 s (default_socket_timeout); the waiter leaves the queue', function () {
    $key = unique('predis:default');
    $admin = client();
    $admin->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 120000]);
    $t = microtime(true);
    try {
        client()->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 0]);
        throw new RuntimeException('expected a timeout');
    } catch (Predis\Connection\ConnectionException $e) {
        check(str_contains($e->getMessage(), 'reading'), $e->getMessage());
    }
    $elapsed = microtime(true) - $t;
    check($elapsed > 59 && $elapsed < 63, "failed after $elapsed s");
    usleep(100000);
    check(fields($admin->executeRaw(['LOCK.INFO', $key]))['waiters'] === 0, 'no waiter left');
    $admin->executeRaw(['LOCK.FORCERELEASE', $key]);
});

test('no-timeout', "read_write_timeout 0: a WAIT is answered after more than 60 s", function () {
    $key = unique('predis:no-timeout');
    $admin = client();
    $first = $admin->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 61000]); // handed over at 61 s
    $t = microtime(true);
    $token = client(['read_write_timeout' => 0])->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 90000]);
    $elapsed = microtime(true) - $t;
    check(is_int($token) && $token > $first, "granted $token after $first");
    check($elapsed > 60.5, "after $elapsed s");
    $admin->executeRaw(['LOCK.FORCERELEASE', $key]);
});

function cluster_client(): Predis\Client
{
    global $HOST, $CLUSTER;
    return new Predis\Client(["tcp://$HOST:{$CLUSTER[0]}"], ['cluster' => 'redis', 'parameters' => ['read_write_timeout' => 0]]);
}

function moved_total(): int
{
    global $HOST, $CLUSTER;
    $sum = 0;
    foreach ($CLUSTER as $port) {
        $sum += moved_count((new Predis\Client(['host' => $HOST, 'port' => $port]))->executeRaw(['INFO', 'errorstats']));
    }
    return $sum;
}

test('main', 'cluster: LOCK.* is refused until a key handler is registered, then goes straight to the key\'s node', function () {
    $cluster = cluster_client();
    try {
        $cluster->executeRaw(['LOCK.ACQUIRE', 'k', 'worker-1', 30000]);
        throw new RuntimeException('expected NotSupportedException');
    } catch (Predis\NotSupportedException $e) {
        check(str_contains($e->getMessage(), "Cannot use 'LOCK.ACQUIRE'"), $e->getMessage());
    }
    // The recipe: the lock key is the first argument of every LOCK.* command.
    $strategy = $cluster->getConnection()->getClusterStrategy();
    foreach (['LOCK.ACQUIRE', 'LOCK.RELEASE', 'LOCK.RENEW', 'LOCK.INFO', 'LOCK.FORCERELEASE'] as $command) {
        $strategy->setCommandHandler($command, fn ($cmd) => $cmd->getArgument(0));
    }
    // predis learns the slot map from the first MOVED (for any command); load it up front.
    $cluster->getConnection()->askSlotsMap();
    $before = moved_total();
    $prefix = unique('predis:cluster');
    for ($i = 0; $i < 10; $i++) {
        $key = "$prefix:$i";
        $token = $cluster->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 30000]);
        check(is_int($token), "token $token");
        check(fields($cluster->executeRaw(['LOCK.INFO', $key]))['token'] === $token, 'info');
        check($cluster->executeRaw(['LOCK.RENEW', $key, 'worker-1', 30000]) === 1, 'renew');
        check($cluster->executeRaw(['LOCK.RELEASE', $key, 'worker-1']) === 0, 'release');
    }
    $key = "$prefix:wait";
    $first = $cluster->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 300]);
    $token = $cluster->executeRaw(['LOCK.ACQUIRE', $key, 'worker-2', 30000, 'WAIT', 10000]);
    check(is_int($token) && $token > $first, "granted $token after $first");
    check($cluster->executeRaw(['LOCK.RELEASE', $key, 'worker-2']) === 0, 'release');
    check(moved_total() === $before, 'no MOVED');
});

// EPHEMERAL: a Predis\Client closes its connection when it is destroyed (out of scope, unset,
// the end of the script or request). After a drop the next command throws
// ConnectionException and the one after it connects again, silently. The dedicated pattern: one
// client kept referenced for as long as the hold lives, renewals on it, any ConnectionException
// on it taken as the loss.
function scoped_ephemeral(string $key): void
{
    client()->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 30000, 'EPHEMERAL']);
}

test('main', 'EPHEMERAL: renewals on a dedicated client keep the hold; its drop throws, then it reconnects; out of scope ends the hold', function () {
    $admin = client();
    $holder = client();
    $key = unique('predis:ephemeral');
    $holder->executeRaw(['LOCK.ACQUIRE', $key, 'worker-1', 30000, 'EPHEMERAL']);
    $id = $holder->executeRaw(['CLIENT', 'ID']);
    for ($i = 0; $i < 3; $i++) {
        usleep(200000);
        check($holder->executeRaw(['LOCK.RENEW', $key, 'worker-1', 30000]) === 1, 'renewed');
    }
    check(fields($admin->executeRaw(['LOCK.INFO', $key]))['ephemeral'] === $id, 'held on the holder\'s connection');
    $admin->executeRaw(['CLIENT', 'KILL', 'ID', $id]);
    usleep(100000);
    check($admin->executeRaw(['LOCK.INFO', $key]) === null, 'gone with the connection');
    try {
        $holder->executeRaw(['LOCK.RENEW', $key, 'worker-1', 30000]);
        throw new RuntimeException('expected the renewal to throw');
    } catch (Predis\Connection\ConnectionException $e) {
    }
    check($holder->executeRaw(['LOCK.RENEW', $key, 'worker-1', 30000]) === 0, 'the command after it reconnects: 0');
    $key = unique('predis:ephemeral-scoped');
    scoped_ephemeral($key);
    usleep(100000);
    check($admin->executeRaw(['LOCK.INFO', $key]) === null, 'the client went out of scope, its connection closed: the hold is gone');
});

run_cases();
