package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// tokenRegistry puts the bearer-token flow of Docker Hub, GHCR, Quay or
// Harbor in front of a test registry: every /v2/ request without a
// valid token gets a 401 whose WWW-Authenticate names a token realm;
// the realm hands anonymous tokens that can pull public repositories
// and, for the right Basic credentials, tokens that can pull those whose
// name has "private" in it too.
type tokenRegistry struct {
	user, pass string

	mu     sync.Mutex
	issued map[string]bool // token → may pull private repositories
	asked  map[string]int  // token requests by "anonymous" or "user:password"
}

func newTokenRegistry(user, pass string) *tokenRegistry {
	return &tokenRegistry{user: user, pass: pass, issued: map[string]bool{}, asked: map[string]int{}}
}

func (tr *tokenRegistry) front(addr string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				tr.token(w, r)
				return
			}
			tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			tr.mu.Lock()
			private, ok := tr.issued[tok]
			tr.mu.Unlock()
			repo := strings.TrimPrefix(r.URL.Path, "/v2/")
			if !ok || (strings.Contains(repo, "private") && !private) {
				scope := ""
				if name, _, found := strings.Cut(repo, "/manifests/"); found {
					scope = fmt.Sprintf(`,scope="repository:%s:pull"`, name)
				} else if name, _, found := strings.Cut(repo, "/blobs/"); found {
					scope = fmt.Sprintf(`,scope="repository:%s:pull"`, name)
				}
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="pinrt-e2e"%s`, addr, scope))
				testimage.WriteRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// token answers the realm: anonymous, or with Basic credentials, which
// must be right.
func (tr *tokenRegistry) token(w http.ResponseWriter, r *http.Request) {
	user, pass, hasAuth := r.BasicAuth()
	who := "anonymous"
	if hasAuth {
		who = user + ":" + pass
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.asked[who]++
	if hasAuth && (user != tr.user || pass != tr.pass) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	tok := fmt.Sprintf("tok-%d", len(tr.issued)+1)
	tr.issued[tok] = hasAuth
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"token": tok, "access_token": tok})
}

// TestImagePullBearerToken: pulls through the token flow real
// registries use, anonymous for a public image and with the pull's
// credentials for a private one, which without them is Unauthenticated.
func TestImagePullBearerToken(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Busybox(t)
	id := testimage.ID(t, img)
	reg.Push(t, "public/busybox:1", img)
	reg.Push(t, "private/busybox:1", img)
	d := StartDaemon(t, Options{})
	tr := newTokenRegistry("alice", "secret")
	reg.Intercept(tr.front(reg.Addr))

	pull := func(ref string, auth *runtimeapi.AuthConfig) (string, error) {
		resp, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
		return resp.GetImageRef(), err
	}
	if got, err := pull(reg.Ref("public/busybox:1"), nil); err != nil || got != id {
		t.Fatalf("anonymous pull of a public image = %q, %v; want %s", got, err, id)
	}
	imgRemove(t, d, reg.Ref("public/busybox:1"))

	before := storeEntries(t, d)
	for name, auth := range map[string]*runtimeapi.AuthConfig{
		"no credentials":    nil,
		"wrong credentials": {Username: "alice", Password: "wrong"},
	} {
		if got, err := pull(reg.Ref("private/busybox:1"), auth); status.Code(err) != codes.Unauthenticated {
			t.Errorf("pull of a private image with %s = %q, %v; want Unauthenticated", name, got, err)
		}
	}
	checkStoreAsBefore(t, d, before)

	if got, err := pull(reg.Ref("private/busybox:1"), &runtimeapi.AuthConfig{Username: "alice", Password: "secret"}); err != nil || got != id {
		t.Fatalf("pull of a private image with its credentials = %q, %v; want %s", got, err, id)
	}
	// The same with the credentials as kubelet may pass them: base64
	// "user:password" in auth.
	imgRemove(t, d, reg.Ref("private/busybox:1"))
	if got, err := pull(reg.Ref("private/busybox:1"), &runtimeapi.AuthConfig{Auth: "YWxpY2U6c2VjcmV0"}); err != nil || got != id {
		t.Fatalf("pull with auth %q = %q, %v; want %s", "YWxpY2U6c2VjcmV0", got, err, id)
	}
	tr.mu.Lock()
	if tr.asked["anonymous"] == 0 || tr.asked["alice:secret"] < 2 {
		t.Errorf("token requests %v: want anonymous ones and two with the pull's credentials", tr.asked)
	}
	tr.mu.Unlock()

	// Credentials the registry knows but may not pull with.
	imgRemove(t, d, reg.Ref("private/busybox:1"))
	before = storeEntries(t, d)
	reg.Intercept(testimage.Denied)
	if got, err := pull(reg.Ref("private/busybox:1"), &runtimeapi.AuthConfig{Username: "alice", Password: "secret"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("pull denied by the registry = %q, %v; want PermissionDenied", got, err)
	}
	checkStoreAsBefore(t, d, before)

	// A registry's rate limit that outlasts the retries.
	reg.Intercept(testimage.TooManyRequests)
	if got, err := pull(reg.Ref("private/busybox:1"), &runtimeapi.AuthConfig{Username: "alice", Password: "secret"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("pull over the registry's rate limit = %q, %v; want ResourceExhausted", got, err)
	}
	checkStoreAsBefore(t, d, before)
}
