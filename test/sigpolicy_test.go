package test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/cosign"
	"github.com/pinrt/pinrt/test/testimage"
)

// sigPolicyEnv is a daemon whose pulls answer to a signature policy,
// and the files that policy is made of.
type sigPolicyEnv struct {
	*ctrEnv
	policy, nsDir, keyPath string
	key                    *cosign.Key
}

func (e *sigPolicyEnv) writePolicy(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// strict is the node's policy: images under <registry>/signed need a
// cosign signature by the test's key, everything else is rejected.
func (e *sigPolicyEnv) strict() string {
	return fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{%q:[
		{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"matchRepository"}}]}}}`, e.reg.Addr+"/signed", e.keyPath)
}

// pullFor pulls ref for a pod of namespace ns, as kubelet does.
func (e *sigPolicyEnv) pullFor(t *testing.T, ref, ns string) (string, error) {
	t.Helper()
	resp, err := e.d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{
		Image: &runtimeapi.ImageSpec{Image: ref},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{
			Name: "p", Uid: "u", Namespace: ns,
		}},
	})
	return resp.GetImageRef(), err
}

// storeFiles lists the files of the image store, the index aside.
func (e *sigPolicyEnv) storeFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	root := filepath.Join(e.d.Root, "images")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root && !strings.HasSuffix(p, "index.json") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// wantSignatureRefused checks the refusal kubelet turns into
// SignatureValidationFailed, and that it left nothing in the store.
func (e *sigPolicyEnv) wantSignatureRefused(t *testing.T, ref, ns string, names ...string) {
	t.Helper()
	before := e.storeFiles(t)
	_, err := e.pullFor(t, ref, ns)
	st := status.Convert(err)
	if st.Code() != codes.Unknown || !strings.HasPrefix(st.Message(), "SignatureValidationFailed: ") {
		t.Fatalf("PullImage(%s) for %q = %v, want Unknown starting with SignatureValidationFailed", ref, ns, err)
	}
	for _, n := range append(names, ref) {
		if !strings.Contains(st.Message(), n) {
			t.Errorf("refusal %q does not name %q", st.Message(), n)
		}
	}
	if after := e.storeFiles(t); !slices.Equal(before, after) {
		t.Errorf("a refused pull changed the store: %v -> %v", before, after)
	}
	if img := imgStatus(t, e.d, ref, false).GetImage(); img != nil {
		t.Errorf("refused image %s is in the store: %v", ref, img)
	}
}

func newSigPolicyEnv(t *testing.T) *sigPolicyEnv {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	e := &sigPolicyEnv{policy: filepath.Join(dir, "policy.json"), nsDir: filepath.Join(dir, "namespaces"), key: cosign.NewKey(t)}
	if err := os.Mkdir(e.nsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The registry's address is known only once the daemon runs: the
	// daemon starts accepting everything, and the strict policy comes as
	// an edit, which must apply without a restart.
	e.writePolicy(t, e.policy, `{"default":[{"type":"insecureAcceptAnything"}]}`)
	e.ctrEnv = newCtrEnvWith(t, fmt.Sprintf("[image]\nsignature_policy = %q\nsignature_policy_dir = %q\n", e.policy, e.nsDir))
	e.keyPath = filepath.Join(dir, "key.pub")
	e.key.WritePublic(t, e.keyPath)
	return e
}

// TestSignaturePolicy: a node that runs only images signed by the keys
// it trusts, driven over CRI as kubelet drives it.
func TestSignaturePolicy(t *testing.T) {
	e := newSigPolicyEnv(t)
	signedTag := e.reg.Ref("signed/busybox:1")
	signedDigest := e.reg.Push(t, "signed/busybox:1", testimage.Busybox(t))
	cosign.Sign(t, signedTag, e.key, cosign.Options{})
	unsigned := e.reg.Ref("signed/unsigned:1")
	e.reg.Push(t, "signed/unsigned:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "unsigned", Content: []byte("x")}}}}))
	tampered := e.reg.Ref("signed/tampered:1")
	e.reg.Push(t, "signed/tampered:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "tampered", Content: []byte("x")}}}}))
	cosign.Sign(t, tampered, e.key, cosign.Options{Tamper: true})
	otherKey := e.reg.Ref("signed/other-key:1")
	e.reg.Push(t, "signed/other-key:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "other", Content: []byte("x")}}}}))
	cosign.Sign(t, otherKey, cosign.NewKey(t), cosign.Options{})
	outside := e.reg.Ref("elsewhere/x:1")
	e.reg.Push(t, "elsewhere/x:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "outside", Content: []byte("x")}}}}))
	cosign.Sign(t, outside, e.key, cosign.Options{})

	// Before the edit, the accept-all policy lets the unsigned image in.
	if _, err := e.pullFor(t, unsigned, "default"); err != nil {
		t.Fatalf("accept-all policy: %v", err)
	}
	imgRemove(t, e.d, unsigned)
	e.writePolicy(t, e.policy, e.strict())
	e.writePolicy(t, filepath.Join(e.nsDir, "lax.json"), `{"default":[{"type":"insecureAcceptAnything"}]}`)

	t.Run("signed image runs", func(t *testing.T) {
		id, err := e.pullFor(t, signedTag, "default")
		if err != nil {
			t.Fatalf("PullImage(%s): %v", signedTag, err)
		}
		if byDigest, err := e.pullFor(t, signedDigest, "default"); err != nil || byDigest != id {
			t.Fatalf("PullImage(%s) = %s, %v; want %s", signedDigest, byDigest, err, id)
		}
		img := imgStatus(t, e.d, signedTag, false).GetImage()
		if img.GetId() != id || !slices.Contains(img.RepoDigests, signedDigest) {
			t.Fatalf("ImageStatus(%s) = %v, want %s with digest %s", signedTag, img, id, signedDigest)
		}
		pod, podCfg := e.pod(t, PodConfig("signed"))
		cfg := e.ctr("signed", "sleep", "60")
		cfg.Image.Image = signedTag
		c := e.run(t, pod, podCfg, cfg)
		if st := e.status(t, c); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container from the signed image: %v", st.State)
		}
	})

	t.Run("unsigned, tampered, untrusted key and out of scope are refused", func(t *testing.T) {
		e.wantSignatureRefused(t, unsigned, "default", e.policy, "sigstoreSigned", "no signature exists")
		e.wantSignatureRefused(t, tampered, "default", e.policy)
		e.wantSignatureRefused(t, otherKey, "default", e.policy)
		e.wantSignatureRefused(t, outside, "default", e.policy, "default: requirements reject")
		// A pull for no pod answers to the node's policy.
		e.wantSignatureRefused(t, unsigned, "", e.policy)
	})

	t.Run("per-namespace policy", func(t *testing.T) {
		if _, err := e.pullFor(t, unsigned, "lax"); err != nil {
			t.Fatalf("lax namespace: %v", err)
		}
		imgRemove(t, e.d, unsigned)
		e.writePolicy(t, filepath.Join(e.nsDir, "strict.json"), `{"default":[{"type":"reject"}]}`)
		e.wantSignatureRefused(t, unsigned, "strict", filepath.Join(e.nsDir, "strict.json"), "reject")
		_, err := e.pullFor(t, signedTag, "../lax")
		wantCode(t, err, codes.InvalidArgument, "namespace")
	})

	t.Run("a broken edit fails pulls, never accepts", func(t *testing.T) {
		e.writePolicy(t, e.policy, `{"default": [`)
		_, err := e.pullFor(t, unsigned, "default")
		wantCode(t, err, codes.FailedPrecondition, e.policy)
		e.writePolicy(t, e.policy, e.strict())
	})

	t.Run("crictl pull", func(t *testing.T) {
		crictl := crictlBinary(t)
		podJSON := filepath.Join(t.TempDir(), "pod.json")
		b, _ := json.Marshal(map[string]any{"metadata": map[string]string{"name": "p", "namespace": "default", "uid": "u"}})
		if err := os.WriteFile(podJSON, b, 0o644); err != nil {
			t.Fatal(err)
		}
		run := func(ref string) (string, error) {
			cmd := exec.Command(crictl, "--runtime-endpoint", "unix://"+e.d.Socket, "--image-endpoint", "unix://"+e.d.Socket,
				"--timeout", "60s", "pull", "--pod-config", podJSON, ref)
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := run(unsigned); err == nil || !strings.Contains(out, "SignatureValidationFailed") || !strings.Contains(out, unsigned) {
			t.Fatalf("crictl pull %s: %v\n%s", unsigned, err, out)
		}
		if out, err := run(signedTag); err != nil {
			t.Fatalf("crictl pull %s: %v\n%s", signedTag, err, out)
		}
	})

	t.Run("through a mirror", func(t *testing.T) {
		// The origin lacks these images; its mirror serves them and the
		// signatures beside them, made for the origin's name.
		mirror := testimage.StartRegistry(t)
		mirror.Push(t, "cache/signed/m:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "m", Content: []byte("m")}}}}))
		cosign.Sign(t, mirror.Ref("cache/signed/m:1"), e.key, cosign.Options{Identity: e.reg.Addr + "/signed/m"})
		mirror.Push(t, "cache/signed/mu:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "mu", Content: []byte("mu")}}}}))
		dropIn := filepath.Join(e.d.ConfigDir, "10-mirror.toml")
		if err := os.WriteFile(dropIn, []byte(fmt.Sprintf("[image.registries.%q]\nmirrors = [%q]\n", e.reg.Addr, mirror.Addr+"/cache")), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(dropIn)
		if err := e.d.Restart(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pullFor(t, e.reg.Ref("signed/m:1"), "default"); err != nil {
			t.Fatalf("signed through the mirror: %v", err)
		}
		if mirror.Requests("/v2/cache/signed/m/manifests/sha256-") == 0 {
			t.Fatalf("the signature was not read from the mirror: %v", mirror.Log())
		}
		e.wantSignatureRefused(t, e.reg.Ref("signed/mu:1"), "default", e.policy, "no signature exists")
	})

	t.Run("a broken policy stops the start", func(t *testing.T) {
		if err := e.d.Stop(); err != nil {
			t.Fatal(err)
		}
		e.writePolicy(t, e.policy, `{"default": "accept"}`)
		if err := e.d.Start(); err == nil {
			t.Fatal("the daemon started with a broken policy")
		}
		if log := e.d.Log(); !strings.Contains(log, e.policy) {
			t.Errorf("the refusal does not name %s:\n%s", e.policy, log)
		}
		e.writePolicy(t, e.policy, e.strict())
		if err := e.d.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pullFor(t, signedTag, "default"); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
	})
}

// crictlBinary builds crictl (once per machine, beside critest) and
// returns its path.
func crictlBinary(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("crictl is built here: the go toolchain is needed")
	}
	cache := os.Getenv("PINRT_VM_CACHE")
	if cache == "" {
		cache = "/var/cache/pinrt-vm"
	}
	repo := RepoRoot()
	critest := lastLine(t, runTool(t, 20*time.Minute, repo, nil, "bash", filepath.Join(repo, "test/critest/build.sh"), cache))
	return filepath.Join(filepath.Dir(critest), "crictl")
}

// TestSignaturePolicyHelperMissing: with a policy configured, a pinrt
// whose pinrt-sigpolicy is missing or cannot run refuses to start, and
// says where it looked, rather than pulling unverified images.
func TestSignaturePolicyHelperMissing(t *testing.T) {
	RequireRoot(t)
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"default":[{"type":"reject"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon's PATH keeps its directories without a pinrt-sigpolicy,
	// so an installed one is not found instead.
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "pinrt-sigpolicy")); err != nil {
			path = append(path, dir)
		}
	}
	cases := []struct {
		name   string
		helper func(t *testing.T, path string) // nil: none
		want   string
	}{
		{"missing", nil, "neither beside pinrt"},
		{"not executable", func(t *testing.T, path string) {
			copyFile(t, filepath.Join(filepath.Dir(Binary(t)), "pinrt-sigpolicy"), path, 0o644)
		}, "is not an executable file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "pinrt")
			copyFile(t, Binary(t), bin, 0o755)
			helper := filepath.Join(filepath.Dir(bin), "pinrt-sigpolicy")
			if c.helper != nil {
				c.helper(t, helper)
			}
			d := NewDaemon(t, Options{
				Config: fmt.Sprintf("[image]\nsignature_policy = %q\n", policy),
				Binary: bin,
				Env:    []string{"PATH=" + strings.Join(path, string(filepath.ListSeparator))},
			})
			if err := d.Start(); err == nil {
				t.Fatal("pinrt started with a policy and no helper to check it")
			}
			if log := d.Log(); !strings.Contains(log, c.want) || !strings.Contains(log, helper) {
				t.Errorf("the refusal does not say %q about %s:\n%s", c.want, helper, log)
			}
		})
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// TestSignaturePolicyCredentials: a verified image in a registry that
// wants credentials, Basic or through a token realm. The policy's check
// reads the signature with the pull's own credentials; a pull without
// them, or with wrong ones, is refused as unauthenticated before
// anything is stored, and one the registry denies as permission denied.
func TestSignaturePolicyCredentials(t *testing.T) {
	e := newSigPolicyEnv(t)
	tag := e.reg.Ref("signed/private:1")
	e.reg.Push(t, "signed/private:1", testimage.Busybox(t))
	cosign.Sign(t, tag, e.key, cosign.Options{})
	e.writePolicy(t, e.policy, e.strict())

	good := &runtimeapi.AuthConfig{Username: "alice", Password: "secret"}
	var mu sync.Mutex
	sigReads := map[string]int{} // signature manifest requests by "user:password"
	e.reg.Intercept(testimage.BasicAuth(good.Username, good.Password, func(r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/sha256-") && strings.HasSuffix(r.URL.Path, ".sig") {
			user, pass, _ := r.BasicAuth()
			mu.Lock()
			sigReads[user+":"+pass]++
			mu.Unlock()
		}
	}))
	pull := func(auth *runtimeapi.AuthConfig) (string, error) {
		resp, err := e.d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{
			Image: &runtimeapi.ImageSpec{Image: tag}, Auth: auth,
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Uid: "u", Namespace: "default"}},
		})
		return resp.GetImageRef(), err
	}

	before := e.storeFiles(t)
	for name, auth := range map[string]*runtimeapi.AuthConfig{
		"no credentials":    nil,
		"wrong credentials": {Username: "alice", Password: "wrong"},
	} {
		if ref, err := pull(auth); status.Code(err) != codes.Unauthenticated {
			t.Errorf("pull with %s = %q, %v; want Unauthenticated", name, ref, err)
		}
	}
	if after := e.storeFiles(t); !slices.Equal(before, after) {
		t.Errorf("refused pulls changed the store: %v -> %v", before, after)
	}

	id, err := pull(good)
	if err != nil {
		t.Fatalf("pull with good credentials: %v", err)
	}
	if img := imgStatus(t, e.d, tag, false).GetImage(); img.GetId() != id {
		t.Fatalf("ImageStatus(%s) = %v, want %s", tag, img, id)
	}
	mu.Lock()
	if sigReads["alice:secret"] == 0 {
		t.Errorf("the signature was never read with the pull's credentials: signature reads by credentials %v", sigReads)
	}
	mu.Unlock()

	// The bearer-token flow of the big registries, for the signature too.
	imgRemove(t, e.d, tag)
	tr := newTokenRegistry("alice", "secret")
	e.reg.Intercept(tr.front(e.reg.Addr))
	if ref, err := pull(nil); status.Code(err) != codes.Unauthenticated {
		t.Errorf("pull without credentials from a token registry = %q, %v; want Unauthenticated", ref, err)
	}
	if got, err := pull(good); err != nil || got != id {
		t.Fatalf("pull with good credentials from a token registry = %q, %v; want %s", got, err, id)
	}

	// A registry that denies the pull while the signatures are read:
	// PermissionDenied, as an unverified pull's 403 is.
	imgRemove(t, e.d, tag)
	e.reg.Intercept(testimage.Denied)
	if ref, err := pull(good); status.Code(err) != codes.PermissionDenied {
		t.Errorf("pull denied by the registry = %q, %v; want PermissionDenied", ref, err)
	}
	// And one over its rate limit: ResourceExhausted, on both paths.
	e.reg.Intercept(testimage.TooManyRequests)
	if ref, err := pull(good); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("pull over the registry's rate limit = %q, %v; want ResourceExhausted", ref, err)
	}
}
