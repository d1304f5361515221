# redis-rb 4.8 against LOCK.*: what docs/clients.md says about it.
#
# Defaults: RESP2, read_timeout 5 s, reconnect_attempts 1 (a command whose read timed out is sent
# again on a new connection). The safe setting on the connection that sends WAIT: read_timeout
# above the WAIT and reconnect_attempts: 0. In a cluster (redis-rb 4's built-in cluster client),
# write LOCK.* in lowercase: the client looks the name up case-sensitively in COMMAND's reply.
require "redis"

HOST = ENV.fetch("LOCK_HOST", "127.0.0.1")
PORT = Integer(ENV.fetch("LOCK_PORT", "6379"))
CLUSTER = ENV.fetch("LOCK_CLUSTER", "").split(",").map { |p| Integer(p) }

$cases = []
def test(name, &block) = $cases << [name, block]
def check(cond, what) = (raise "check failed: #{what}" unless cond)
$n = 0
def unique(prefix) = "#{prefix}:#{Process.pid}:#{Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)}:#{$n += 1}"
def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def admin = (@admin ||= Redis.new(host: HOST, port: PORT))
def lock_stats = admin.info("lock").transform_values(&:to_i)
def fields(flat) = flat.each_slice(2).to_h

test "acquire, renew, LOCK.INFO (flat array), release" do
  redis = Redis.new(host: HOST, port: PORT)
  key = unique("redis-rb:basic")
  token = redis.call("lock.acquire", key, "worker-1", 30000) # Integer, or nil if busy
  check(token.is_a?(Integer) && token > 0, "token #{token.inspect}")
  check(redis.call("lock.acquire", key, "worker-2", 30000).nil?, "busy: nil")
  check(redis.call("lock.renew", key, "worker-1", 30000) == 1, "renew")
  info = redis.call("lock.info", key)
  check(info.is_a?(Array) && info.length == 16, "shape #{info.inspect}")
  f = fields(info)
  check(f["owner"] == "worker-1" && f["count"] == 1 && f["token"] == token && f["waiters"] == 0, f.inspect)
  check(f.keys == %w[owner count ttl token ephemeral waiters mode holders], "names in order: #{f.keys}")
  check(f["ephemeral"].nil? && f["mode"] == "exclusive" && fields(f["holders"][0])["owner"] == "worker-1", f.inspect)
  check(redis.call("lock.release", key, "worker-1") == 0, "release")
  check(redis.call("lock.info", key).nil?, "free")
end

test "WAIT granted returns the token, timeout nil (read_timeout above the WAIT, reconnect_attempts 0)" do
  key = unique("redis-rb:wait")
  first = admin.call("lock.acquire", key, "worker-1", 30000)
  waiter = Redis.new(host: HOST, port: PORT, read_timeout: 15, reconnect_attempts: 0)
  releaser = Thread.new { sleep 0.3; Redis.new(host: HOST, port: PORT).call("lock.release", key, "worker-1") }
  token = waiter.call("lock.acquire", key, "worker-2", 30000, "WAIT", 10000)
  releaser.join
  check(token.is_a?(Integer) && token > first, "granted #{token} after #{first}")
  begin
    check(fields(waiter.call("lock.info", key))["owner"] == "worker-2", "worker-2 holds it")
  ensure
    check(waiter.call("lock.release", key, "worker-2") == 0, "release")
  end
  admin.call("lock.acquire", key, "worker-1", 30000)
  t = now
  check(waiter.call("lock.acquire", key, "worker-2", 30000, "WAIT", 300).nil?, "nil")
  check(now - t < 2, "on time")
  admin.call("lock.release", key, "worker-1")
end

test "defaults: a WAIT over 5 s is cut at read_timeout 5 s and sent again" do
  # The lease ends at 6 s; the server would answer a WAIT 5500 nil at 5.5 s, but redis-rb gives
  # up at 5 s and sends the WAIT again on a new connection: granted at 6 s, later than asked.
  key = unique("redis-rb:defaults")
  defaults = Redis.new(host: HOST, port: PORT)
  check(defaults._client.options[:read_timeout] == 5 && defaults._client.options[:reconnect_attempts] == 1, "defaults")
  first = admin.call("lock.acquire", key, "worker-1", 6000)
  before = lock_stats
  t = now
  reply = defaults.call("lock.acquire", key, "worker-2", 30000, "WAIT", 5500)
  elapsed = now - t
  after = lock_stats
  check(reply.is_a?(Integer) && reply > first, "reply #{reply.inspect}")
  check(elapsed > 5.8, "returned after #{elapsed.round(2)} s")
  check(after["lock_waits_started"] - before["lock_waits_started"] == 2, "2 waits")
  admin.call("lock.release", key, "worker-2")
end

test "read_timeout above the WAIT and reconnect_attempts 0 keep the WAIT as asked" do
  key = unique("redis-rb:setting")
  admin.call("lock.acquire", key, "worker-1", 6000)
  before = lock_stats
  t = now
  redis = Redis.new(host: HOST, port: PORT, read_timeout: 7, reconnect_attempts: 0)
  reply = redis.call("lock.acquire", key, "worker-2", 30000, "WAIT", 5500)
  elapsed = now - t
  after = lock_stats
  check(reply.nil? && elapsed > 5.4 && elapsed < 6.5, "nil at 5.5 s: #{reply.inspect} #{elapsed}")
  check(after["lock_waits_started"] - before["lock_waits_started"] == 1, "1 wait")
end

test "a read timeout with reconnect_attempts 0 raises and closes: the waiter leaves the queue" do
  key = unique("redis-rb:close")
  admin.call("lock.acquire", key, "worker-1", 30000)
  redis = Redis.new(host: HOST, port: PORT, read_timeout: 0.5, reconnect_attempts: 0)
  begin
    redis.call("lock.acquire", key, "worker-2", 30000, "WAIT", 3000)
    raise "expected a timeout"
  rescue Redis::TimeoutError
  end
  sleep 0.1
  check(fields(admin.call("lock.info", key))["waiters"] == 0, "no waiter left")
  admin.call("lock.release", key, "worker-1")
end

# EPHEMERAL: a Redis object is one connection, shared by every thread that uses the object, and
# redis-rb replaces it behind the caller's back: a command that times out closes it (the next
# command reconnects), and after a drop the next command reconnects silently
# (reconnect_attempts 1, the default). The dedicated pattern: a Redis object of its own for the
# hold, renewals on it, reconnect_attempts: 0 so a drop raises Redis::ConnectionError instead.
test "EPHEMERAL: renewals on a dedicated Redis (reconnect_attempts: 0) keep the hold, and its drop raises" do
  holder = Redis.new(host: HOST, port: PORT, reconnect_attempts: 0)
  key = unique("redis-rb:ephemeral")
  holder.call("lock.acquire", key, "worker-1", 30000, "EPHEMERAL")
  id = holder.call("client", "id")
  3.times { sleep 0.2; check(holder.call("lock.renew", key, "worker-1", 30000) == 1, "renewed") }
  check(fields(admin.call("lock.info", key))["ephemeral"] == id, "held on the holder's connection")
  admin.call("client", "kill", "id", id)
  sleep 0.1
  check(admin.call("lock.info", key).nil?, "gone with the connection")
  begin
    holder.call("lock.renew", key, "worker-1", 30000)
    raise "expected the renewal to raise"
  rescue Redis::ConnectionError
  end
  check(holder.call("lock.renew", key, "worker-1", 30000) == 0, "the command after it reconnects: 0")
end

test "EPHEMERAL on a Redis with its defaults: a drop reconnects silently; another thread's timed-out command closes the connection" do
  redis = Redis.new(host: HOST, port: PORT)
  key = unique("redis-rb:ephemeral-default")
  redis.call("lock.acquire", key, "worker-1", 30000, "EPHEMERAL")
  admin.call("client", "kill", "id", redis.call("client", "id"))
  sleep 0.1
  check(redis.call("lock.renew", key, "worker-1", 30000) == 0, "no error: the renewal ran on a new connection, 0")

  shared = Redis.new(host: HOST, port: PORT, read_timeout: 0.3)
  key = unique("redis-rb:ephemeral-shared")
  busy = unique("redis-rb:ephemeral-busy")
  admin.call("lock.acquire", busy, "other", 30000)
  shared.call("lock.acquire", key, "worker-1", 30000, "EPHEMERAL")
  check(!admin.call("lock.info", key).nil?, "held")
  Thread.new do
    shared.call("lock.acquire", busy, "worker-2", 30000, "WAIT", 1000)
  rescue Redis::TimeoutError
  end.join
  sleep 0.1
  check(admin.call("lock.info", key).nil?, "the timed-out command closed the shared connection: the hold is gone")
  check(shared.ping == "PONG", "and the object goes on, on a new connection")
  admin.call("lock.forcerelease", busy)
end

def moved_per_node
  CLUSTER.to_h do |port|
    stats = Redis.new(host: HOST, port: port).info("errorstats")
    [port, stats.fetch("errorstat_MOVED", "count=0")[/count=(\d+)/, 1].to_i]
  end
end

def keys_on_every_node(prefix)
  node = Redis.new(host: HOST, port: CLUSTER[0])
  ranges = node.call("cluster", "slots").map { |low, high, master| [low, high, master[1]] }
  keys = {}
  (0..).each do |i|
    slot = node.call("cluster", "keyslot", "#{prefix}:#{i}")
    keys[ranges.find { |low, high, _| low <= slot && slot <= high }[2]] ||= "#{prefix}:#{i}"
    break if keys.size == CLUSTER.size
  end
  keys.values
end

test "cluster: lowercase lock.* goes straight to the key's node; uppercase is redirected" do
  cluster = Redis.new(cluster: ["redis://#{HOST}:#{CLUSTER[0]}"], read_timeout: 15, reconnect_attempts: 0)
  keys = keys_on_every_node(unique("redis-rb:cluster"))
  before = moved_per_node
  keys.each do |key|
    token = cluster.call("lock.acquire", key, "worker-1", 30000)
    check(token.is_a?(Integer), "token #{token.inspect}")
    check(fields(cluster.call("lock.info", key))["token"] == token, "info")
    check(cluster.call("lock.renew", key, "worker-1", 30000) == 1, "renew")
    check(cluster.call("lock.release", key, "worker-1") == 0, "release")
  end
  key = keys[1]
  first = cluster.call("lock.acquire", key, "worker-1", 30000)
  releaser = Thread.new { sleep 0.3; cluster.call("lock.release", key, "worker-1") }
  waiter = Redis.new(cluster: ["redis://#{HOST}:#{CLUSTER[0]}"], read_timeout: 15, reconnect_attempts: 0)
  token = waiter.call("lock.acquire", key, "worker-2", 30000, "WAIT", 10000)
  releaser.join
  check(token > first, "granted #{token} after #{first}")
  check(waiter.call("lock.release", key, "worker-2") == 0, "release")
  check(moved_per_node == before, "lowercase: no MOVED #{before} -> #{moved_per_node}")

  before = moved_per_node
  5.times do
    keys.each do |k|
      check(cluster.call("LOCK.ACQUIRE", k, "worker-1", 30000).is_a?(Integer), "uppercase works")
      check(cluster.call("LOCK.RELEASE", k, "worker-1") == 0, "uppercase release")
    end
  end
  after = moved_per_node
  redirected = after.sum { |p, m| m - before[p] }
  check(redirected > 0, "uppercase: some of the 30 calls redirected, got #{redirected}")
end

failed = 0
$cases.each do |name, block|
  block.call
  puts "ok - #{name}"
rescue StandardError => e
  failed += 1
  puts "not ok - #{name}: #{e.class}: #{e.message}"
  e.backtrace.first(3).each { |l| puts "    #{l}" }
end
exit(failed.zero? ? 0 : 1)
