// go-redis v5 (gopkg.in/redis.v5) against LOCK.*: what docs/clients.md says about it. Run by
// tests/clients/run.sh with Debian's packages: GO111MODULE=off GOPATH=/usr/share/gocode go run main.go
//
// Defaults: RESP2, ReadTimeout 3 s, MaxRetries 0. The safe setting: ReadTimeout above the WAIT
// (or -1: none). In a cluster, v5 cannot read Redis 7's COMMAND reply, so it does not know where
// a LOCK.* command's key is: it sends it to an arbitrary node and follows MOVED.
package main

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"gopkg.in/redis.v5"
)

var (
	host    = os.Getenv("LOCK_HOST")
	addr    = fmt.Sprintf("%s:%s", host, os.Getenv("LOCK_PORT"))
	cluster = strings.Split(os.Getenv("LOCK_CLUSTER"), ",")
)

func check(cond bool, format string, args ...interface{}) {
	if !cond {
		panic(fmt.Sprintf(format, args...))
	}
}

var n int

func unique(prefix string) string {
	n++
	return fmt.Sprintf("%s:%d:%d:%d", prefix, os.Getpid(), time.Now().UnixNano(), n)
}

// do sends any command: v5 has no Do, so build a Cmd and Process it. A nil reply is redis.Nil.
type processor interface {
	Process(redis.Cmder) error
}

func do(c processor, args ...interface{}) (interface{}, error) {
	cmd := redis.NewCmd(args...)
	c.Process(cmd)
	return cmd.Result()
}

func info(c processor, key string) map[string]interface{} {
	v, err := do(c, "LOCK.INFO", key)
	if err == redis.Nil {
		return nil
	}
	check(err == nil, "LOCK.INFO: %v", err)
	flat := v.([]interface{}) // RESP2: [name, value, ...]; owner a string, numbers int64
	out := map[string]interface{}{}
	for i := 0; i+1 < len(flat); i += 2 {
		out[flat[i].(string)] = flat[i+1]
	}
	return out
}

func stat(text, field string) int64 {
	for _, line := range strings.Split(text, "\r\n") {
		if strings.HasPrefix(line, field) {
			var v int64
			fmt.Sscan(strings.TrimPrefix(line, field), &v)
			return v
		}
	}
	return 0
}

func basics() {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	key := unique("go-redis:basic")
	v, err := do(c, "LOCK.ACQUIRE", key, "worker-1", 30000)
	token, _ := v.(int64)
	check(err == nil && token > 0, "token %v %v", v, err)
	_, err = do(c, "LOCK.ACQUIRE", key, "worker-2", 30000)
	check(err == redis.Nil, "busy: redis.Nil, got %v", err)
	v, _ = do(c, "LOCK.RENEW", key, "worker-1", 30000)
	check(v == int64(1), "renew %v", v)
	i := info(c, key)
	check(i["owner"] == "worker-1" && i["count"] == int64(1) && i["token"] == token && i["waiters"] == int64(0), "info %v", i)
	v, _ = do(c, "LOCK.RELEASE", key, "worker-1")
	check(v == int64(0), "release %v", v)
	check(info(c, key) == nil, "free")
}

// A WAIT longer than the default ReadTimeout (3 s) fails at 3 s; the connection is dropped, so
// the waiter leaves the server's queue.
func defaultReadTimeout() {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	key := unique("go-redis:default")
	do(admin, "LOCK.ACQUIRE", key, "worker-1", 30000)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	waits := stat(admin.Info("lock").Val(), "lock_waits_started:")
	start := time.Now()
	_, err := do(c, "LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 4000)
	elapsed := time.Since(start)
	check(stat(admin.Info("lock").Val(), "lock_waits_started:")-waits == 1, "sent once (MaxRetries 0)")
	check(err != nil && strings.Contains(err.Error(), "timeout"), "timeout error, got %v", err)
	check(elapsed > 2900*time.Millisecond && elapsed < 3900*time.Millisecond, "at 3 s: %v", elapsed)
	time.Sleep(100 * time.Millisecond)
	check(info(admin, key)["waiters"] == int64(0), "no waiter left")
	do(admin, "LOCK.RELEASE", key, "worker-1")
}

func readTimeoutAboveTheWait() {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	key := unique("go-redis:setting")
	first, _ := do(admin, "LOCK.ACQUIRE", key, "worker-1", 30000)
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 6 * time.Second})
	defer c.Close()
	start := time.Now()
	_, err := do(c, "LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 4000)
	check(err == redis.Nil && time.Since(start) > 3900*time.Millisecond, "nil after the full 4 s: %v %v", err, time.Since(start))
	go func() {
		time.Sleep(300 * time.Millisecond)
		do(admin, "LOCK.RELEASE", key, "worker-1")
	}()
	none := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: -1}) // -1: no read timeout
	defer none.Close()
	v, err := do(none, "LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000)
	check(err == nil && v.(int64) > first.(int64), "granted %v after %v: %v", v, first, err)
	v, _ = do(none, "LOCK.RELEASE", key, "worker-2")
	check(v == int64(0), "release %v", v)
}

func moved() int64 {
	var sum int64
	for _, p := range cluster {
		c := redis.NewClient(&redis.Options{Addr: host + ":" + p})
		sum += stat(c.Info("errorstats").Val(), "errorstat_MOVED:count=")
		c.Close()
	}
	return sum
}

func clusterRedirected() {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{host + ":" + cluster[0]}, ReadTimeout: -1})
	defer c.Close()
	c.Ping() // loads the slot map
	prefix := unique("go-redis:cluster")
	before := moved()
	calls := 0
	for i := 0; i < 10; i++ {
		key := fmt.Sprintf("%s:%d", prefix, i)
		v, err := do(c, "LOCK.ACQUIRE", key, "worker-1", 30000)
		check(err == nil && v.(int64) > 0, "token %v %v", v, err)
		check(info(c, key)["token"] == v, "info")
		v, _ = do(c, "LOCK.RELEASE", key, "worker-1")
		check(v == int64(0), "release %v", v)
		calls += 3
	}
	m := moved() - before
	check(m > 0, "some of %d calls redirected, got %d", calls, m)
	// WAIT through the cluster client.
	key := prefix + ":wait"
	first, _ := do(c, "LOCK.ACQUIRE", key, "worker-1", 30000)
	go func() {
		time.Sleep(300 * time.Millisecond)
		do(c, "LOCK.RELEASE", key, "worker-1")
	}()
	v, err := do(c, "LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000)
	check(err == nil && v.(int64) > first.(int64), "granted %v after %v: %v", v, first, err)
	do(c, "LOCK.RELEASE", key, "worker-2")
	fmt.Printf("# go-redis cluster: %d of %d LOCK.* calls were redirected (MOVED)\n", m, calls)
}

func held(admin processor, key string) bool { return info(admin, key) != nil }

// EPHEMERAL: a redis.Client is a pool that closes connections behind the caller's back: one idle
// for IdleTimeout (5 min by default, reaped every IdleCheckFrequency, 1 min), and one whose
// command failed or timed out. Its next command then runs on a new connection, silently. The
// dedicated pattern: a client of its own with PoolSize 1, renewals on it (so its one connection
// is never idle), any error on it taken as the loss, and the next renewal's 0 as the loss too.
func ephemeral() {
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	def := redis.NewClient(&redis.Options{Addr: addr})
	opt := reflect.ValueOf(def).Elem().FieldByName("baseClient").FieldByName("opt").Elem()
	check(time.Duration(opt.FieldByName("IdleTimeout").Int()) == 5*time.Minute, "default IdleTimeout 5 min")
	check(time.Duration(opt.FieldByName("IdleCheckFrequency").Int()) == time.Minute, "default idle check every minute")
	check(opt.FieldByName("PoolSize").Int() == 10, "default PoolSize 10")
	def.Close()

	// The idle reaper, scaled down: renewals on the dedicated client keep its connection busy.
	holder := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, IdleTimeout: 500 * time.Millisecond, IdleCheckFrequency: 100 * time.Millisecond})
	defer holder.Close()
	key := unique("go-redis:ephemeral")
	_, err := do(holder, "LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
	check(err == nil, "acquire %v", err)
	id, _ := do(holder, "CLIENT", "ID")
	for i := 0; i < 8; i++ {
		time.Sleep(200 * time.Millisecond)
		v, err := do(holder, "LOCK.RENEW", key, "worker-1", 30000)
		check(v == int64(1) && err == nil, "renewal %d: %v %v", i, v, err)
	}
	check(info(admin, key)["ephemeral"] == id, "1.6 s later, still held on the same connection %v: %v", id, info(admin, key))
	time.Sleep(1200 * time.Millisecond) // no renewal: the connection idles past IdleTimeout
	check(!held(admin, key), "the idle reaper closed the holding connection: the hold is gone")
	v, err := do(holder, "LOCK.RENEW", key, "worker-1", 30000)
	check(err == nil && v == int64(0), "the next renewal runs on a new connection and answers 0: %v %v", v, err)

	// A command that times out on the client closes the connection it ran on.
	busy := unique("go-redis:ephemeral-busy")
	do(admin, "LOCK.ACQUIRE", busy, "other", 30000)
	short := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, ReadTimeout: 300 * time.Millisecond})
	defer short.Close()
	key = unique("go-redis:ephemeral-timeout")
	do(short, "LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
	check(held(admin, key), "held")
	_, err = do(short, "LOCK.ACQUIRE", busy, "worker-1", 30000, "WAIT", 1000)
	check(err != nil && strings.Contains(err.Error(), "timeout"), "timed out: %v", err)
	time.Sleep(100 * time.Millisecond)
	check(!held(admin, key), "the timed-out command's connection was closed: the hold is gone")
	v, err = do(short, "PING")
	check(err == nil && v == "PONG", "and the client goes on: %v %v", v, err)
	do(admin, "LOCK.FORCERELEASE", busy)

	// The holding connection dropped: the next renewal fails (MaxRetries 0); the one after it
	// reconnects and answers 0.
	killed := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer killed.Close()
	key = unique("go-redis:ephemeral-killed")
	do(killed, "LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL")
	id, _ = do(killed, "CLIENT", "ID")
	do(admin, "CLIENT", "KILL", "ID", id)
	time.Sleep(100 * time.Millisecond)
	check(!held(admin, key), "gone with the connection")
	_, err = do(killed, "LOCK.RENEW", key, "worker-1", 30000)
	check(err != nil, "the next renewal fails: %v", err)
	v, err = do(killed, "LOCK.RENEW", key, "worker-1", 30000)
	check(err == nil && v == int64(0), "the one after it reconnects and answers 0: %v %v", v, err)
}

func main() {
	failed := 0
	for _, t := range []struct {
		name string
		fn   func()
	}{
		{"acquire, renew, LOCK.INFO (flat array), release; nil is redis.Nil", basics},
		{"defaults: a WAIT over 3 s fails at the 3 s ReadTimeout; the waiter leaves the queue", defaultReadTimeout},
		{"ReadTimeout above the WAIT (or -1): timeout nil after the full WAIT, granted returns the token", readTimeoutAboveTheWait},
		{"cluster: LOCK.* is sent to an arbitrary node and follows MOVED; WAIT works", clusterRedirected},
		{"EPHEMERAL: renewals on a PoolSize 1 client keep the hold; the idle reaper, a timed-out command and a drop each end it", ephemeral},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					failed++
					fmt.Printf("not ok - %s: %v\n", t.name, r)
				}
			}()
			t.fn()
			fmt.Printf("ok - %s\n", t.name)
		}()
	}
	if failed > 0 {
		os.Exit(1)
	}
}
