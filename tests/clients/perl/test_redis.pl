#!/usr/bin/perl
# Perl Redis 2.000 against LOCK.*: what docs/clients.md says about it.
#
# Defaults: RESP2, no read timeout, no reconnect. A dotted command is called by name:
# my $acquire = 'lock.acquire'; $redis->$acquire(...). With read_timeout below a WAIT the read
# dies and the connection is closed, so the waiter leaves the server's queue. No cluster client.
use strict;
use warnings;
use Redis;
use Time::HiRes qw(time sleep);

my $server = ($ENV{LOCK_HOST} || '127.0.0.1') . ':' . ($ENV{LOCK_PORT} || 6379);
my ($acquire, $release, $renew, $info, $force) =
  ('lock.acquire', 'lock.release', 'lock.renew', 'lock.info', 'lock.forcerelease');

my @cases;
sub test { push @cases, [@_] }
sub check { die "check failed: $_[1]\n" unless $_[0] }
my $n = 0;
sub unique { sprintf '%s:%d:%.6f:%d', $_[0], $$, time, ++$n }
sub fields { my %f = $_[0]->$info($_[1]); return \%f }    # LOCK.INFO's flat list as a hash

test 'acquire, renew, LOCK.INFO (flat list), release' => sub {
  my $redis = Redis->new(server => $server);
  my $key = unique('perl:basic');
  my $token = $redis->$acquire($key, 'worker-1', 30000);    # a number (as a string), or undef
  check($token =~ /^\d+$/ && $token > 0, "token $token");
  check(!defined $redis->$acquire($key, 'worker-2', 30000), 'busy: undef');
  check($redis->$renew($key, 'worker-1', 30000) == 1, 'renew');
  my @flat = $redis->$info($key);
  check(@flat == 16 && $flat[0] eq 'owner', "list: @flat");
  my $f = fields($redis, $key);
  check($f->{owner} eq 'worker-1' && $f->{count} == 1 && $f->{token} == $token && $f->{waiters} == 0, "@flat");
  check(!eval { $redis->$acquire($key, 'worker-1', 0); 1 } && $@ =~ /ERR lease/, "an error dies: $@");
  check($redis->$release($key, 'worker-1') == 0, 'release');
  check(!defined $redis->$info($key), 'free');
};

test 'WAIT with defaults: granted returns the token, timeout undef' => sub {
  my $admin = Redis->new(server => $server);
  my $key = unique('perl:wait');
  my $first = $admin->$acquire($key, 'worker-1', 300);    # the lease ends in 0.3 s
  my $waiter = Redis->new(server => $server);
  my $token = $waiter->$acquire($key, 'worker-2', 30000, 'WAIT', 10000);
  check(defined $token && $token > $first, "granted after $first");
  check(fields($waiter, $key)->{owner} eq 'worker-2', 'worker-2 holds it');
  check($waiter->$release($key, 'worker-2') == 0, 'release');
  $admin->$acquire($key, 'worker-1', 30000);
  my $t = time;
  check(!defined $waiter->$acquire($key, 'worker-2', 30000, 'WAIT', 300), 'undef');
  check(time - $t < 2, 'on time');
  $admin->$release($key, 'worker-1');
};

test 'read_timeout below the WAIT dies and closes the connection: the waiter leaves the queue' => sub {
  my $admin = Redis->new(server => $server);
  my $key = unique('perl:timeout');
  $admin->$acquire($key, 'worker-1', 30000);
  my $redis = Redis->new(server => $server, read_timeout => 0.5);
  my $t = time;
  check(!eval { $redis->$acquire($key, 'worker-2', 30000, 'WAIT', 3000); 1 }, 'dies');
  check($@ =~ /Error while reading/ && time - $t < 2, "at the read timeout: $@");
  sleep 0.1;
  check(fields($admin, $key)->{waiters} == 0, 'no waiter left');
  check(!defined $redis->ping, 'the connection is closed');
  # read_timeout above the WAIT: the full WAIT, then undef.
  my $ok = Redis->new(server => $server, read_timeout => 5);
  $t = time;
  check(!defined $ok->$acquire($key, 'worker-2', 30000, 'WAIT', 1000) && time - $t > 0.9, 'undef after 1 s');
  $admin->$release($key, 'worker-1');
};

# EPHEMERAL: a Redis object closes its connection when it is destroyed (out of scope). With the
# defaults (no reconnect) a drop makes every later command die, which is the loss; with
# `reconnect => N` it reconnects silently and only LOCK.RENEW's 0 tells. The dedicated pattern:
# one object kept referenced for as long as the hold lives, renewals on it, no `reconnect`.
test 'EPHEMERAL: renewals on a dedicated Redis keep the hold; its drop dies; reconnect => N hides it; out of scope ends it' => sub {
  my $admin = Redis->new(server => $server);
  my $holder = Redis->new(server => $server);
  my ($client) = ('client');
  my $key = unique('perl:ephemeral');
  $holder->$acquire($key, 'worker-1', 30000, 'EPHEMERAL');
  my $id = $holder->$client('ID');
  for (1 .. 3) { sleep 0.2; check($holder->$renew($key, 'worker-1', 30000) == 1, 'renewed') }
  check(fields($admin, $key)->{ephemeral} == $id, 'held on the holder\'s connection');
  $admin->$client('KILL', 'ID', $id);
  sleep 0.1;
  check(!defined $admin->$info($key), 'gone with the connection');
  check(!eval { $holder->$renew($key, 'worker-1', 30000); 1 }, "the next renewal dies: $@");
  check(!defined $holder->ping, 'no reconnect: ping answers undef');
  check(!eval { $holder->$renew($key, 'worker-1', 30000); 1 }, "and a renewal still dies: $@");

  my $reconnecting = Redis->new(server => $server, reconnect => 2);
  $key = unique('perl:ephemeral-reconnect');
  $reconnecting->$acquire($key, 'worker-1', 30000, 'EPHEMERAL');
  $admin->$client('KILL', 'ID', $reconnecting->$client('ID'));
  sleep 0.1;
  check($reconnecting->$renew($key, 'worker-1', 30000) == 0, 'reconnect => 2: no error, the renewal answers 0');

  $key = unique('perl:ephemeral-scoped');
  { my $scoped = Redis->new(server => $server); $scoped->$acquire($key, 'worker-1', 30000, 'EPHEMERAL') }
  sleep 0.1;
  check(!defined $admin->$info($key), 'the object went out of scope, its connection closed: the hold is gone');
};

my $failed = 0;
for my $case (@cases) {
  my ($name, $fn) = @$case;
  if (eval { $fn->(); 1 }) {
    print "ok - $name\n";
  } else {
    $failed++;
    my $why = $@;
    chomp $why;
    print "not ok - $name: $why\n";
  }
}
exit($failed ? 1 : 0);
