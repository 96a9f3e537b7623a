package test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// Hostile image names must fail as the client's fault (InvalidArgument)
// or as an absent image or registry (NotFound, Unavailable), and never
// take the daemon down. "bad..host" used to SIGSEGV it: Go's resolver
// refused the name locally with a *net.DNSError that unwraps to nil, and
// mapping that error panicked outside the interceptor's recover. Such
// names now fail parsing; the overlong host still takes the resolver
// path, which also refuses it locally (over 254 bytes), so no DNS query
// leaves the machine.
func TestImagePullHostileNames(t *testing.T) {
	reg := testimage.StartRegistry(t)
	reg.Push(t, "good:1", testimage.Busybox(t))
	d := StartDaemon(t, Options{Config: "[image]\npull_timeout = \"5s\"\n"})

	refs := map[string]string{
		"double dot host":  "bad..host/x:1",
		"path traversal":   "../../etc/passwd",
		"upper case":       "UPPER/case:1",
		"300 characters":   "reg.invalid/" + strings.Repeat("a", 288) + ":1",
		"empty":            "",
		"nul byte":         "busybox\x00:1",
		"only a separator": "@",
		"overlong host":    strings.Repeat(strings.Repeat("h", 60)+".", 5) + "test/x:1",
	}
	for name, ref := range refs {
		t.Run(name, func(t *testing.T) {
			_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
			switch status.Code(err) {
			case codes.InvalidArgument, codes.NotFound, codes.Unavailable:
				t.Logf("%q: %v", ref, err)
			default:
				t.Errorf("PullImage(%q) = %v, want InvalidArgument, NotFound or Unavailable", ref, err)
			}
			if !d.Running() {
				t.Fatalf("daemon died on PullImage(%q):\n%s", ref, d.Log())
			}
			if _, err := d.Runtime.Version(Ctx(t), &runtimeapi.VersionRequest{}); err != nil {
				t.Fatalf("Version after PullImage(%q): %v", ref, err)
			}
		})
	}
	if id := imgPull(t, d, reg.Ref("good:1")); id == "" {
		t.Fatal("a good pull after the hostile ones returned no image ID")
	}
	if strings.Contains(d.Log(), "panic") {
		t.Errorf("the daemon log has a panic:\n%s", d.Log())
	}
}
