package sigpolicy

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// env is a node with a policy, its namespace directory and a fake helper.
type env struct {
	dir, policy, nsDir string
	record             string
	v                  *Verifier
}

// newEnv writes a node policy and a namespace directory holding
// strict.json, and makes a Verifier whose helper is f.
func newEnv(t *testing.T, f fakeHelper, regs map[string]Registry) *env {
	t.Helper()
	e := &env{dir: t.TempDir()}
	e.policy = filepath.Join(e.dir, "policy.json")
	e.nsDir = filepath.Join(e.dir, "namespaces")
	for _, p := range []string{e.policy, filepath.Join(e.nsDir, "strict.json")} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(`{"default":[{"type":"reject"}]}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	helper, record := useFake(t, f)
	e.record = record
	v, err := New(Config{Helper: helper, Policy: e.policy, PolicyDir: e.nsDir, StateDir: filepath.Join(e.dir, "state"), Registries: regs})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.v = v
	return e
}

func (e *env) verify(t *testing.T, ref, ns string, auth *Auth) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e.v.Verify(ctx, Request{Ref: ref, Namespace: ns, Auth: auth})
}

// lastRun is the request of the helper's last run.
func (e *env) lastRun(t *testing.T) HelperRequest {
	t.Helper()
	r := runs(t, e.record)
	if len(r) == 0 {
		t.Fatal("the helper never ran")
	}
	return r[len(r)-1].Request
}

// An accepted image: the digest comes back, and the helper got the
// policy that governs the namespace and every path of the state dir.
func TestVerifyAccepted(t *testing.T) {
	e := newEnv(t, fakeHelper{Digest: testDigest}, nil)
	cases := []struct{ ns, policy string }{
		{"default", e.policy},
		{"", e.policy},
		{"strict", filepath.Join(e.nsDir, "strict.json")},
	}
	for _, c := range cases {
		start := time.Now()
		d, err := e.verify(t, "reg.example:5000/app/x:1", c.ns, nil)
		if err != nil || d != testDigest {
			t.Fatalf("namespace %q: Verify = %q, %v; want %s", c.ns, d, err, testDigest)
		}
		req := e.lastRun(t)
		if req.Version != ProtocolVersion || req.Op != OpVerify || req.Ref != "reg.example:5000/app/x:1" || req.Policy != c.policy || req.Credentials != nil {
			t.Errorf("namespace %q: request %+v, want verify of the ref under %s without credentials", c.ns, req, c.policy)
		}
		// The caller's 30 s, not the 5 min bound.
		if left := req.Deadline.Sub(start); left <= 0 || left > 31*time.Second {
			t.Errorf("namespace %q: deadline %v is %v away, want the caller's 30 s", c.ns, req.Deadline, left)
		}
	}
	p := e.lastRun(t).Paths
	state := filepath.Join(e.dir, "state")
	want := HelperPaths{
		RegistriesDir: state + "/registries.d", RegistriesConf: p.RegistriesConf, RegistriesConfDir: state + "/registries.conf.d",
		CertDir: state + "/certs.d", AuthFile: state + "/no-auth.json", SignaturePolicy: state + "/no-policy.json",
	}
	if p == nil || *p != want || !strings.HasPrefix(p.RegistriesConf, state+"/registries-") {
		t.Fatalf("paths %+v, want %+v", p, want)
	}
	if b, err := os.ReadFile(filepath.Join(state, "registries.d", "default.yaml")); err != nil || string(b) != "default-docker:\n  use-sigstore-attachments: true\n" {
		t.Fatalf("registries.d/default.yaml = %q, %v", b, err)
	}
}

// A refusal carries what the operator needs; every other kind of answer
// becomes its errdefs class with the helper's message.
func TestVerifyHelperErrors(t *testing.T) {
	rej := &HelperError{Kind: KindRejected, Message: "A signature was required, but no signature exists", Scope: `transports.docker["reg.example:5000/app"]`, Requirements: "requirements sigstoreSigned"}
	e := newEnv(t, fakeHelper{Error: rej}, nil)
	_, err := e.verify(t, "reg.example:5000/app/x:1", "", nil)
	var re *RejectedError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a RejectedError", err)
	}
	if re.Image != "reg.example:5000/app/x:1" || re.PolicyFile != e.policy || re.Scope != rej.Scope || re.Requirements != rej.Requirements || re.Reason.Error() != rej.Message {
		t.Fatalf("RejectedError %+v, want the helper's answer for %s", re, e.policy)
	}
	want := `image reg.example:5000/app/x:1 is rejected by signature policy ` + e.policy +
		` (transports.docker["reg.example:5000/app"]: requirements sigstoreSigned): A signature was required, but no signature exists`
	if err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}

	cases := []struct {
		kind  string
		class func(error) bool
	}{
		{KindInvalid, errdefs.IsInvalidArgument},
		{KindFailedPrecondition, errdefs.IsFailedPrecondition},
		{KindUnavailable, errdefs.IsUnavailable},
		{KindNotFound, errdefs.IsNotFound},
		{KindDataLoss, errdefs.IsDataLoss},
		{KindUnauthenticated, errdefs.IsUnauthorized},
		{KindPermissionDenied, errdefs.IsPermissionDenied},
		{KindResourceExhausted, errdefs.IsResourceExhausted},
		{"no-such-kind", errdefs.IsInternal},
	}
	for _, c := range cases {
		t.Run(c.kind, func(t *testing.T) {
			msg := "verifying the signatures of reg.example:5000/app/x:1: " + c.kind
			useFake(t, fakeHelper{Error: &HelperError{Kind: c.kind, Message: msg}})
			_, err := e.verify(t, "reg.example:5000/app/x:1", "", nil)
			if !c.class(err) || !strings.Contains(err.Error(), msg) || errors.As(err, new(*RejectedError)) {
				t.Fatalf("err = %v, want the class of %s with the helper's message", err, c.kind)
			}
		})
	}
}

// A helper that does not answer properly is pinrt's own failure,
// Internal, with the end of what it said on stderr.
func TestVerifyHelperBroken(t *testing.T) {
	e := newEnv(t, fakeHelper{}, nil)
	cases := []struct {
		name  string
		fake  fakeHelper
		class func(error) bool
		want  []string
	}{
		{"exit status", fakeHelper{Stderr: "pinrt-sigpolicy: verify: boom\n", Exit: 3}, errdefs.IsInternal, []string{"exit status 3", "boom"}},
		{"exit status after an answer", fakeHelper{Digest: testDigest, Exit: 1}, errdefs.IsInternal, []string{"exit status 1"}},
		{"killed", fakeHelper{Stderr: "about to die", Kill: true}, errdefs.IsInternal, []string{"signal: killed", "about to die"}},
		{"garbage", fakeHelper{Raw: "hello, I am not JSON"}, errdefs.IsInternal, []string{"hello, I am not JSON", "not a response"}},
		{"two answers", fakeHelper{Raw: `{"digest":"sha256:1"} {"digest":"sha256:2"}`}, errdefs.IsInternal, []string{"not a response"}},
		{"no answer", fakeHelper{Raw: " "}, errdefs.IsInternal, []string{"not a response"}},
		{"accepted without a digest", fakeHelper{}, errdefs.IsInternal, []string{"without a digest"}},
		{"endless answer", fakeHelper{StdoutFill: 3 << 20}, errdefs.IsInternal, []string{"more than 1048576 bytes"}},
		{"endless stderr", fakeHelper{Stderr: "the start", StderrFill: 1 << 20, Exit: 1}, errdefs.IsInternal, []string{`ends with "...eeee`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			useFake(t, c.fake)
			_, err := e.verify(t, "reg.example:5000/app/x:1", "", nil)
			if !c.class(err) {
				t.Fatalf("err = %v, want Internal", err)
			}
			for _, w := range append(c.want, e.v.cfg.Helper, "verify reg.example:5000/app/x:1") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "the start") || len(err.Error()) > stderrTail+1024 {
				t.Errorf("error of %d bytes keeps more than the end of stderr", len(err.Error()))
			}
		})
	}

	e.v.cfg.Helper = filepath.Join(e.dir, "no-such-helper")
	if _, err := e.verify(t, "reg.example:5000/app/x:1", "", nil); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), e.v.cfg.Helper) {
		t.Fatalf("missing helper: err = %v, want FailedPrecondition naming it", err)
	}
}

// The context's end kills the helper, and whatever it started, and the
// call returns at once with the context's error.
func TestVerifyCancelled(t *testing.T) {
	e := newEnv(t, fakeHelper{}, nil)
	cases := []struct {
		name   string
		fake   fakeHelper
		cancel func(context.Context) (context.Context, context.CancelFunc)
		want   error
	}{
		{"deadline", fakeHelper{Hang: true}, func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", fakeHelper{Hang: true}, func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"grandchild holding the pipes", fakeHelper{Grandchild: true}, func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 500*time.Millisecond)
		}, context.DeadlineExceeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, record := useFake(t, c.fake)
			ctx, cancel := c.cancel(context.Background())
			defer cancel()
			start := time.Now()
			_, err := e.v.Verify(ctx, Request{Ref: "reg.example:5000/app/x:1"})
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Verify returned %v after the context's end", took)
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), e.v.cfg.Helper) {
				t.Fatalf("err = %v, want %v naming the helper", err, c.want)
			}
			for _, r := range runs(t, record) {
				waitGone(t, r.Pid)
			}
		})
	}
}

// waitGone fails unless pid is gone or a zombie within a second: the
// helper is reaped by Verify, a grandchild by whoever inherits it.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 100; i++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("process %d of the helper still runs", pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// Requests decided before any helper: no policy applies, a namespace
// that cannot name a file, a reference or credentials that cannot be
// passed on.
func TestVerifyWithoutHelper(t *testing.T) {
	e := newEnv(t, fakeHelper{Digest: testDigest}, nil)
	noNode, err := New(Config{Helper: e.v.cfg.Helper, PolicyDir: e.nsDir, StateDir: filepath.Join(e.dir, "state2")})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		v     *Verifier
		req   Request
		class func(error) bool // nil: no error, no digest
	}{
		{"no node policy, no namespace file", noNode, Request{Ref: "reg.example/x:1", Namespace: "default"}, nil},
		{"no node policy, no namespace", noNode, Request{Ref: "reg.example/x:1"}, nil},
		{"namespace with a slash", e.v, Request{Ref: "reg.example/x:1", Namespace: "../policy"}, errdefs.IsInvalidArgument},
		{"namespace in capitals", e.v, Request{Ref: "reg.example/x:1", Namespace: "Strict"}, errdefs.IsInvalidArgument},
		{"namespace too long", e.v, Request{Ref: "reg.example/x:1", Namespace: strings.Repeat("a", 64)}, errdefs.IsInvalidArgument},
		{"namespace starting with a dash", e.v, Request{Ref: "reg.example/x:1", Namespace: "-x"}, errdefs.IsInvalidArgument},
		{"reference without a host", e.v, Request{Ref: "library/busybox:1"}, errdefs.IsInvalidArgument},
		{"reference of one component", e.v, Request{Ref: "busybox"}, errdefs.IsInvalidArgument},
		{"auth not base64", e.v, Request{Ref: "reg.example/x:1", Auth: &Auth{Auth: "%%%"}}, errdefs.IsInvalidArgument},
		{"skip_origin without mirrors", withRegistries(t, e, map[string]Registry{"reg.example": {SkipOrigin: true}}),
			Request{Ref: "reg.example/x:1"}, errdefs.IsFailedPrecondition},
	}
	before := len(runs(t, e.record))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := c.v.Verify(context.Background(), c.req)
			if c.class == nil && (err != nil || d != "") {
				t.Fatalf("Verify = %q, %v; want no check", d, err)
			}
			if c.class != nil && !c.class(err) {
				t.Fatalf("err = %v, want its class", err)
			}
			if n := len(runs(t, e.record)); n != before {
				t.Fatalf("the helper ran %d time(s)", n-before)
			}
		})
	}
}

func withRegistries(t *testing.T, e *env, regs map[string]Registry) *Verifier {
	t.Helper()
	cfg := e.v.cfg
	cfg.Registries, cfg.StateDir = regs, filepath.Join(t.TempDir(), "state")
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The pull's credentials reach the helper decoded, in the one form the
// CRI gave them.
func TestVerifyCredentials(t *testing.T) {
	e := newEnv(t, fakeHelper{Digest: testDigest}, nil)
	b64 := base64.StdEncoding.EncodeToString
	cases := []struct {
		name string
		auth *Auth
		want *HelperCredentials
	}{
		{"none", nil, nil},
		{"empty", &Auth{}, nil},
		{"user and password", &Auth{Username: "u", Password: "p"}, &HelperCredentials{Username: "u", Password: "p"}},
		{"auth, a colon in the password", &Auth{Auth: b64([]byte("u:p:w"))}, &HelperCredentials{Username: "u", Password: "p:w"}},
		{"username wins over auth", &Auth{Username: "u", Password: "p", Auth: b64([]byte("x:y"))}, &HelperCredentials{Username: "u", Password: "p"}},
		{"identity token", &Auth{IdentityToken: "it"}, &HelperCredentials{IdentityToken: "it"}},
		{"registry token alone", &Auth{Username: "u", Password: "p", RegistryToken: "rt"}, &HelperCredentials{RegistryToken: "rt"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := e.verify(t, "reg.example/x:1", "", c.auth); err != nil {
				t.Fatal(err)
			}
			got := e.lastRun(t).Credentials
			if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
				t.Fatalf("credentials %+v, want %+v", got, c.want)
			}
		})
	}
}

// New has the helper check every policy file, and a broken one stops it
// with the helper's message naming the file.
func TestNewChecksPolicies(t *testing.T) {
	dir := t.TempDir()
	node, nsDir := filepath.Join(dir, "policy.json"), filepath.Join(dir, "ns")
	if err := os.Mkdir(nsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{node, nsDir + "/a.json", nsDir + "/b.json", nsDir + "/notes.txt"} {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := func(helper string) Config {
		return Config{Helper: helper, Policy: node, PolicyDir: nsDir, StateDir: filepath.Join(dir, "state")}
	}

	helper, record := useFake(t, fakeHelper{BrokenPolicy: nsDir + "/b.json"})
	_, err := New(cfg(helper))
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), nsDir+"/b.json") {
		t.Fatalf("New: err = %v, want FailedPrecondition naming b.json", err)
	}
	r := runs(t, record)
	if len(r) != 1 || r[0].Request.Op != OpCheck || strings.Join(r[0].Request.Policies, " ") != node+" "+nsDir+"/a.json "+nsDir+"/b.json" {
		t.Fatalf("runs %+v, want one check of the node's policy and the namespaces' .json files", r)
	}

	helper, _ = useFake(t, fakeHelper{})
	if _, err := New(cfg(helper)); err != nil {
		t.Fatalf("New with good policies: %v", err)
	}
	if _, err := New(cfg("")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New without a helper: err = %v", err)
	}
	c := cfg(helper)
	c.PolicyDir = filepath.Join(dir, "missing")
	if _, err := New(c); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("New with a missing policy directory: err = %v", err)
	}
	// No policy file at all: nothing to check, the helper does not run.
	helper, record = useFake(t, fakeHelper{Exit: 1})
	if _, err := New(Config{Helper: helper, PolicyDir: t.TempDir(), StateDir: filepath.Join(dir, "state")}); err != nil || len(runs(t, record)) != 0 {
		t.Fatalf("New with an empty policy directory: %v, %d runs", err, len(runs(t, record)))
	}
}

// The registries.conf of a pull, as containers-registries.conf(5) reads
// it: the mirrors in order before the origin, the last mirror in the
// origin's place for skip_origin, plain HTTP where pinrt uses it.
func TestRegistriesConf(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("PEM"), 0o644); err != nil {
		t.Fatal(err)
	}
	regs := map[string]Registry{
		"reg.example":       {Mirrors: []string{"mirror.example/cache/", "127.0.0.1:5000"}},
		"skip.example":      {Mirrors: []string{"a.example", "localhost:5000/b"}, SkipOrigin: true},
		"insecure.example":  {Insecure: true, CAFile: ca},
		"[::1]:5000":        {},
		"plain.example:443": {},
	}
	e := newEnv(t, fakeHelper{Digest: testDigest}, regs)
	cases := []struct{ host, want string }{
		{"reg.example", `[[registry]]
prefix = 'reg.example'
location = 'reg.example'
insecure = false

[[registry.mirror]]
location = 'mirror.example/cache'
insecure = false

[[registry.mirror]]
location = '127.0.0.1:5000'
insecure = true
`},
		{"skip.example", `[[registry]]
prefix = 'skip.example'
location = 'localhost:5000/b'
insecure = true

[[registry.mirror]]
location = 'a.example'
insecure = false
`},
		{"insecure.example", "[[registry]]\nprefix = 'insecure.example'\nlocation = 'insecure.example'\ninsecure = true\nmirror = []\n"},
		{"[::1]:5000", "[[registry]]\nprefix = '[::1]:5000'\nlocation = '[::1]:5000'\ninsecure = true\nmirror = []\n"},
		{"plain.example:443", "[[registry]]\nprefix = 'plain.example:443'\nlocation = 'plain.example:443'\ninsecure = false\nmirror = []\n"},
	}
	seen := map[string]string{}
	for _, c := range cases {
		if _, err := e.verify(t, c.host+"/app/x:1", "", nil); err != nil {
			t.Fatal(err)
		}
		path := e.lastRun(t).Paths.RegistriesConf
		b, err := os.ReadFile(path)
		if err != nil || string(b) != c.want {
			t.Errorf("%s: %s = %q, %v; want %q", c.host, path, b, err, c.want)
		}
		if other, ok := seen[path]; ok {
			t.Errorf("%s and %s share %s", c.host, other, path)
		}
		seen[path] = c.host
	}
	// Same content, same file: the library caches it by path.
	_, _ = e.verify(t, "reg.example/other:2", "", nil)
	if p := e.lastRun(t).Paths.RegistriesConf; seen[p] != "reg.example" {
		t.Errorf("a second pull from reg.example got %s", p)
	}
	if b, err := os.ReadFile(filepath.Join(e.dir, "state", "certs.d", "insecure.example", "ca.crt")); err != nil || string(b) != "PEM" {
		t.Errorf("certs.d/insecure.example/ca.crt = %q, %v", b, err)
	}
}

func TestTailBuffer(t *testing.T) {
	cases := []struct {
		name   string
		writes []string
		want   string
	}{
		{"short", []string{"ab", "cd"}, "abcd"},
		{"exactly full", []string{"abcdefgh"}, "abcdefgh"},
		{"spills over", []string{"abcdef", "ghij"}, "...cdefghij"},
		{"one big write", []string{"x", "0123456789"}, "...23456789"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := &tailBuffer{max: 8}
			for _, w := range c.writes {
				if n, err := tb.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if got := tb.String(); got != c.want {
				t.Fatalf("tail %q, want %q", got, c.want)
			}
		})
	}
}
