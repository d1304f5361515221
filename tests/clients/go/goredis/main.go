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
