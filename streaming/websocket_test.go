package streaming

import (
	"strconv"
	"testing"
	"time"
)

// The WebSocket translation learns a URL's streams from its CRI call:
// once, for the kind of URL it was handed out as, within the TTL.
func TestTokens(t *testing.T) {
	var tk tokens
	tk.add("http://127.0.0.1:1/exec/abc", streamOptions{kind: "exec", stdin: true, tty: true})
	if _, ok := tk.take("attach", "abc"); ok {
		t.Error("an exec token was taken as an attach's")
	}
	o, ok := tk.take("exec", "abc")
	if !ok || !o.stdin || !o.tty || o.stdout {
		t.Errorf("take = %+v, %v; want the exec's options", o, ok)
	}
	if _, ok := tk.take("exec", "abc"); ok {
		t.Error("a token was taken twice")
	}
	if _, ok := tk.take("exec", "never"); ok {
		t.Error("a token never handed out was taken")
	}

	tk.add("http://127.0.0.1:1/exec/old", streamOptions{kind: "exec"})
	tk.expire("old")
	if _, ok := tk.take("exec", "old"); ok {
		t.Error("an expired token was taken")
	}

	// Expired entries go at the next add; live ones are bounded.
	tk.add("http://127.0.0.1:1/exec/stale", streamOptions{kind: "exec"})
	tk.expire("stale")
	for i := range maxTokens + 10 {
		tk.add("http://127.0.0.1:1/attach/t"+strconv.Itoa(i), streamOptions{kind: "attach"})
	}
	tk.mu.Lock()
	n, stale := len(tk.m), tk.m["stale"]
	tk.mu.Unlock()
	if n != maxTokens || stale.kind != "" {
		t.Errorf("after %d adds: %d tokens kept (want %d), the expired one kept: %v", maxTokens+10, n, maxTokens, stale.kind != "")
	}
}

// expire makes token's entry one second past its TTL.
func (t *tokens) expire(token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o := t.m[token]
	o.expires = time.Now().Add(-time.Second)
	t.m[token] = o
}
