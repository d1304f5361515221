<?php
// A few lines of test harness shared by the PHP client tests. Each case prints `ok - name` or
// `not ok - name: why`; run.sh counts them. The first argument picks a group of cases, so
// run.sh can run the slow ones (a 60 s default timeout) in parallel. Servers come from
// LOCK_HOST, LOCK_PORT and LOCK_CLUSTER (comma-separated master ports).

$HOST = getenv('LOCK_HOST') ?: '127.0.0.1';
$PORT = (int) (getenv('LOCK_PORT') ?: 6379);
$CLUSTER = array_map('intval', array_filter(explode(',', getenv('LOCK_CLUSTER') ?: '')));

$CASES = [];
function test(string $group, string $name, callable $fn): void
{
    global $CASES;
    $CASES[] = [$group, $name, $fn];
}

function run_cases(): void
{
    global $CASES, $argv;
    $group = $argv[1] ?? 'main';
    $failed = 0;
    foreach ($CASES as [$g, $name, $fn]) {
        if ($g !== $group) {
            continue;
        }
        try {
            $fn();
            echo "ok - $name\n";
        } catch (Throwable $e) {
            $failed++;
            echo "not ok - $name: " . get_class($e) . ': ' . $e->getMessage() . ' at line ' . $e->getLine() . "\n";
        }
    }
    exit($failed ? 1 : 0);
}

function check(bool $cond, string $what): void
{
    if (!$cond) {
        throw new RuntimeException("check failed: $what");
    }
}

function unique(string $prefix): string
{
    static $n = 0;
    return sprintf('%s:%d:%d:%d', $prefix, getmypid(), hrtime(true), ++$n);
}

// LOCK.INFO's flat [name, value, ...] reply as an array keyed by name.
function fields(array $flat): array
{
    $out = [];
    for ($i = 0; $i + 1 < count($flat); $i += 2) {
        $out[$flat[$i]] = $flat[$i + 1];
    }
    return $out;
}

function moved_count(string $errorstats): int
{
    return preg_match('/errorstat_MOVED:count=(\d+)/', $errorstats, $m) ? (int) $m[1] : 0;
}
