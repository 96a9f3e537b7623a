package streaming

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

// A URL taken by the library (a SPDY client, or a WebSocket one of the
// protocols it serves itself) is forgotten by the translation too: the
// tokens it keeps are the library's in flight, not every URL of the
// last minute. maxTokens SPDY execs within a minute (a busy node) left
// no room, and each WebSocket v5 exec or attach after them got a 404.
func TestTokensTakenByTheLibraryAreForgotten(t *testing.T) {
	s := newTestServer(t, &fakeTargets{rt: &fakeRuntime{code: 3}}, 1)
	for range maxTokens {
		resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"true"}, Stdout: true})
		if err != nil {
			t.Fatal(err)
		}
		// What the library answers a request that is no upgrade; it
		// has consumed the token all the same.
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, resp.Url, nil))
		if rec.Code == http.StatusNotFound {
			t.Fatalf("the library did not know the token of %s", resp.Url)
		}
	}
	resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"false"}, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	err = clientStream(context.Background(), resp.Url, "v5")
	var ee interface{ ExitStatus() int } // client-go's exit error
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("v5 exec after %d SPDY ones: %v, want exit code 3", maxTokens, err)
	}
}
