// redigo against LOCK.*: what docs/clients.md says about it. Run by tests/clients/run.sh with
// Debian's packages: GO111MODULE=off GOPATH=/usr/share/gocode go run main.go
//
// Defaults: RESP2, no read timeout. With DialReadTimeout set below a WAIT, redis.DoWithTimeout
// gives that one command a longer read deadline. A read timeout closes the connection, so the
// waiter leaves the server's queue. No cluster client.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"
)

var addr = fmt.Sprintf("%s:%s", os.Getenv("LOCK_HOST"), os.Getenv("LOCK_PORT"))

func dial(options ...redis.DialOption) redis.Conn {
	c, err := redis.Dial("tcp", addr, options...)
	if err != nil {
		panic(err)
	}
	return c
}

func check(cond bool, format string, args ...interface{}) {
	if !cond {
		panic(fmt.Sprintf(format, args...))
	}
}

func must(v interface{}, err error) interface{} {
	if err != nil {
		panic(err)
	}
	return v
}

var n int

func unique(prefix string) string {
	n++
	return fmt.Sprintf("%s:%d:%d:%d", prefix, os.Getpid(), time.Now().UnixNano(), n)
}

// lockInfo reads LOCK.INFO's flat [name, value, ...] reply into a map (nil when free).
func lockInfo(c redis.Conn, key string) map[string]interface{} {
	values, err := redis.Values(c.Do("LOCK.INFO", key))
	if err == redis.ErrNil {
		return nil
	}
	check(err == nil, "LOCK.INFO: %v", err)
	info := map[string]interface{}{}
	for i := 0; i+1 < len(values); i += 2 {
		name, _ := redis.String(values[i], nil)
		info[name] = values[i+1] // []byte for owner, int64 for the numbers
	}
	return info
}

func basics() {
	c := dial()
	defer c.Close()
	key := unique("redigo:basic")
	token, err := redis.Int64(c.Do("LOCK.ACQUIRE", key, "worker-1", 30000))
	check(err == nil && token > 0, "token %d %v", token, err)
	_, err = redis.Int64(c.Do("LOCK.ACQUIRE", key, "worker-2", 30000))
	check(err == redis.ErrNil, "busy: ErrNil, got %v", err)
	check(must(redis.Int64(c.Do("LOCK.RENEW", key, "worker-1", 30000))).(int64) == 1, "renew")
	info := lockInfo(c, key)
	check(string(info["owner"].([]byte)) == "worker-1" && info["count"].(int64) == 1, "info %v", info)
	check(info["token"].(int64) == token && info["waiters"].(int64) == 0, "info %v", info)
	_, err = redis.StringMap(c.Do("LOCK.INFO", key))
	check(err != nil, "StringMap refuses the integer values")
	check(must(redis.Int64(c.Do("LOCK.RELEASE", key, "worker-1"))).(int64) == 0, "release")
	check(lockInfo(c, key) == nil, "free")
}

func waitWithDefaults() {
	admin := dial()
	defer admin.Close()
	key := unique("redigo:wait")
	first := must(redis.Int64(admin.Do("LOCK.ACQUIRE", key, "worker-1", 30000))).(int64)
	go func() {
		time.Sleep(300 * time.Millisecond)
		r := dial()
		r.Do("LOCK.RELEASE", key, "worker-1")
		r.Close()
	}()
	c := dial() // no read timeout by default
	defer c.Close()
	token, err := redis.Int64(c.Do("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 10000))
	check(err == nil && token > first, "granted %d after %d: %v", token, first, err)
	check(must(redis.Int64(c.Do("LOCK.RELEASE", key, "worker-2"))).(int64) == 0, "release")
	admin.Do("LOCK.ACQUIRE", key, "worker-1", 30000)
	start := time.Now()
	_, err = redis.Int64(c.Do("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 300))
	check(err == redis.ErrNil && time.Since(start) < 2*time.Second, "timeout: ErrNil, got %v", err)
	admin.Do("LOCK.RELEASE", key, "worker-1")
}

func readTimeoutAndDoWithTimeout() {
	admin := dial()
	defer admin.Close()
	key := unique("redigo:timeout")
	admin.Do("LOCK.ACQUIRE", key, "worker-1", 30000)
	c := dial(redis.DialReadTimeout(500 * time.Millisecond))
	start := time.Now()
	_, err := c.Do("LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 3000)
	check(err != nil && strings.Contains(err.Error(), "timeout"), "read timeout: %v", err)
	check(time.Since(start) < 2*time.Second, "at the read timeout")
	check(c.Err() != nil, "the connection is closed after a read timeout")
	time.Sleep(100 * time.Millisecond)
	check(lockInfo(admin, key)["waiters"].(int64) == 0, "no waiter left")
	c.Close()

	// DoWithTimeout: a longer deadline for the one command that waits.
	c = dial(redis.DialReadTimeout(500 * time.Millisecond))
	defer c.Close()
	start = time.Now()
	v, err := redis.DoWithTimeout(c, 3*time.Second, "LOCK.ACQUIRE", key, "worker-2", 30000, "WAIT", 1000)
	check(err == nil && v == nil, "WAIT 1000 with a 3 s deadline: nil, got %v %v", v, err)
	check(time.Since(start) > 900*time.Millisecond, "waited the full WAIT")
	admin.Do("LOCK.RELEASE", key, "worker-1")
}

// EPHEMERAL: redigo never reconnects a Conn. The dedicated pattern: a redis.Dial'd Conn of its
// own, kept open for as long as the hold lives, renewals on it; an error on it leaves it broken
// (c.Err() != nil), which is the loss. A redis.Pool closes connections behind the caller's
// back: Close() on a pooled Conn closes it for real while the pool keeps MaxIdle (0 by default)
// idle ones, and Get() closes an idle one older than IdleTimeout.
func ephemeral() {
	admin := dial()
	defer admin.Close()
	held := func(key string) bool { return lockInfo(admin, key) != nil }

	holder := dial()
	key := unique("redigo:ephemeral")
	must(holder.Do("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL"))
	for i := 0; i < 3; i++ {
		time.Sleep(200 * time.Millisecond)
		check(must(redis.Int64(holder.Do("LOCK.RENEW", key, "worker-1", 30000))).(int64) == 1, "renewal %d", i)
	}
	id := must(redis.Int64(holder.Do("CLIENT", "ID"))).(int64)
	check(lockInfo(admin, key)["ephemeral"] == id, "held on the dedicated connection")
	must(admin.Do("CLIENT", "KILL", "ID", id))
	time.Sleep(100 * time.Millisecond)
	check(!held(key), "gone with the connection")
	_, err := holder.Do("LOCK.RENEW", key, "worker-1", 30000)
	check(err != nil && holder.Err() != nil, "the next renewal fails and the Conn stays broken: %v", err)
	_, err = holder.Do("PING")
	check(err != nil, "no reconnect: %v", err)
	holder.Close()

	// A Pool with its defaults (MaxIdle 0): Close() closes the connection, and the hold with it.
	pool := &redis.Pool{Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	c := pool.Get()
	key = unique("redigo:ephemeral-pool")
	must(c.Do("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL"))
	check(held(key), "held")
	c.Close()
	time.Sleep(100 * time.Millisecond)
	check(!held(key), "MaxIdle 0: Close() closed the connection; the hold is gone")

	// MaxIdle 1, IdleTimeout 300 ms: the connection waits idle in the pool, and the first Get()
	// after 300 ms closes it.
	pool = &redis.Pool{MaxIdle: 1, IdleTimeout: 300 * time.Millisecond, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	c = pool.Get()
	key = unique("redigo:ephemeral-idle")
	must(c.Do("LOCK.ACQUIRE", key, "worker-1", 30000, "EPHEMERAL"))
	c.Close()
	time.Sleep(500 * time.Millisecond)
	check(held(key), "kept idle in the pool: still held")
	c = pool.Get()
	must(c.Do("PING"))
	c.Close()
	time.Sleep(100 * time.Millisecond)
	check(!held(key), "Get() closed the stale idle connection: the hold is gone")
}

func main() {
	failed := 0
	for _, t := range []struct {
		name string
		fn   func()
	}{
		{"acquire, renew, LOCK.INFO (flat array; StringMap fails on its integers), release", basics},
		{"WAIT with defaults: granted returns the token, timeout nil", waitWithDefaults},
		{"DialReadTimeout below the WAIT closes the connection; DoWithTimeout lifts it for one command", readTimeoutAndDoWithTimeout},
		{"EPHEMERAL: a dedicated Conn keeps the hold and never reconnects; a Pool's Close() (MaxIdle 0) and IdleTimeout end it", ephemeral},
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
