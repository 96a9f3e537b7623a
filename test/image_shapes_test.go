package test

import (
	"archive/tar"
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// Issue 10: pinrt only ever pulled images its own code built, and refused
// every layer GNU tar wrote. These tests pull images shaped the way
// registries really serve them (GNU and POSIX tar, gzip at several
// levels, zstd, uncompressed, Docker schema 2, indexes and manifest
// lists, whiteouts, hard links, a named USER) and run them, and pull
// through a registry that damages, throttles or withholds blobs.

// longName forces a GNU ././@LongLink entry and a pax path record.
var longName = "long/" + strings.Repeat("n", 120)

// payload is two layers on top of busybox: the second whites out a file
// and a directory of the first and makes one of its directories opaque.
func payload() [][]testimage.File {
	return [][]testimage.File{{
		{Path: "dir/"}, {Path: "dir/keep", Content: []byte("keep\n")}, {Path: "dir/removed", Content: []byte("removed\n")},
		{Path: "gonedir/"}, {Path: "gonedir/x", Content: []byte("x\n")},
		{Path: "opq/"}, {Path: "opq/old", Content: []byte("old\n")}, {Path: "opq/sub/"}, {Path: "opq/sub/deep", Content: []byte("deep\n")},
		{Path: "hard/"}, {Path: "hard/a", Content: []byte("linked\n")}, {Path: "hard/b", Type: tar.TypeLink, Linkname: "hard/a"},
		{Path: "srv/", Mode: 0o750, UID: 33, GID: 33}, {Path: "srv/suid", Content: []byte("#!/bin/sh\n"), Mode: 0o4755},
		{Path: "long/"}, {Path: longName, Content: []byte("long\n")},
		{Path: "sym", Type: tar.TypeSymlink, Linkname: "dir/keep"},
	}, {
		{Path: "dir/"}, {Path: "dir/.wh.removed"},
		{Path: ".wh.gonedir"},
		{Path: "opq/"}, {Path: "opq/.wh..wh..opq"}, {Path: "opq/new", Content: []byte("new\n")},
	}}
}

// payloadChecks are shell conditions that hold in a container of an image
// with payload() on top.
var payloadChecks = []string{
	`test "$(cat /dir/keep)" = keep`,
	`test ! -e /dir/removed`,
	`test "$(ls -A /dir)" = keep`, // and no whiteout file shows
	`test ! -e /gonedir`,
	`test "$(ls -A /opq)" = new`, // the opaque directory hides old and sub
	`test ! -e /opq/sub/deep`,
	`test "$(cat /opq/new)" = new`,
	`test "$(stat -c %i /hard/a)" = "$(stat -c %i /hard/b)"`,
	`test "$(stat -c %h /hard/b)" = 2`,
	`test "$(cat /hard/b)" = linked`,
	`test "$(stat -c '%a %u %g' /srv)" = "750 33 33"`,
	`test "$(stat -c %a /srv/suid)" = 4755`,
	`test "$(cat /` + longName + `)" = long`,
	`test "$(readlink /sym)" = dir/keep`,
	`test "$(stat -c %a /)" = 755`,
	`test "$(stat -c %a /tmp)" = 1777`,
}

// writeChecks change an image with payload() on top: each copies a
// lower file or directory up, or removes one.
var writeChecks = []string{
	`echo more >>/dir/keep && test "$(cat /dir/keep)" = "$(printf 'keep\nmore')"`,
	`mkdir /opq/made && touch /opq/made/f && test -e /opq/made/f`,
	`rm /hard/a && test "$(cat /hard/b)" = linked`,
	`chown 33:33 /dir/keep && test "$(stat -c '%u %g' /dir/keep)" = "33 33"`,
	`touch /srv/new && test "$(stat -c '%u %g' /srv/new)" = "0 0"`,
	`chmod 700 /srv/suid && test "$(stat -c %a /srv/suid)" = 700`,
	`test "$(stat -c '%u %g' /)" = "0 0"`,
}

// checkScript runs each argument as a condition and names the ones that
// fail, so a failure says what the image got wrong.
const checkScript = `fail=0
for c in "$@"; do
	eval "$c" || { echo "FAIL: $c"; fail=1; }
done
exit $fail`

// runChecks runs checks in a container of image ref in pod and returns
// its exit code and output; the container is removed.
func (e *ctrEnv) runChecks(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name, ref string, checks []string) (int32, string) {
	t.Helper()
	return e.runChecksAs(t, pod, podCfg, name, ref, nil, checks)
}

// runChecksAs is runChecks as user uid, or the image's user when nil.
func (e *ctrEnv) runChecksAs(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name, ref string, uid *int64, checks []string) (int32, string) {
	t.Helper()
	cfg := e.ctr(name, append([]string{"sh", "-c", checkScript, "check"}, checks...)...)
	cfg.Image = &runtimeapi.ImageSpec{Image: ref}
	if uid != nil {
		cfg.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: *uid}
	}
	id := e.run(t, pod, podCfg, cfg)
	st := e.waitExit(t, id, time.Minute)
	out := readFile(t, st.LogPath)
	if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Errorf("RemoveContainer(%s): %v", name, err)
	}
	return st.ExitCode, out
}

// pullRunRemove pulls ref, checks PullImage's ID, runs checks in it and
// removes the image.
func (e *ctrEnv) pullRunRemove(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name, ref, wantID string, checks []string) {
	t.Helper()
	if got := e.pull(t, ref); got != wantID {
		t.Fatalf("PullImage(%s) = %s, want %s", ref, got, wantID)
	}
	if code, out := e.runChecks(t, pod, podCfg, name, ref, checks); code != 0 {
		t.Errorf("checks in %s exited %d:\n%s", ref, code, out)
	}
	imgRemove(t, e.d, ref)
	if st := imgStatus(t, e.d, ref, false).Image; st != nil {
		t.Errorf("ImageStatus(%s) after RemoveImage = %v, want nil", ref, st)
	}
}

func TestImageShapes(t *testing.T) {
	e := newCtrEnv(t)
	pod, podCfg := e.pod(t, PodConfig("shapes"))

	// The checks must be able to fail: plain busybox has no payload.
	t.Run("ChecksFailOnBusybox", func(t *testing.T) {
		code, out := e.runChecks(t, pod, podCfg, "control", e.busybox, payloadChecks)
		if code != 1 || !strings.Contains(out, "FAIL: "+payloadChecks[0]) {
			t.Errorf("checks on plain busybox exited %d with %q, want 1 naming %q", code, out, payloadChecks[0])
		}
	})

	shapes := []testimage.Shape{
		{},
		{Tar: testimage.GNUTar, Compression: testimage.Gzip1},
		{Tar: testimage.GNUTar, Compression: testimage.Gzip9},
		{Tar: testimage.GNUTar, Compression: testimage.Zstd},
		{Tar: testimage.GNUTar, Compression: testimage.Uncompressed},
		{Tar: testimage.PosixTar, Compression: testimage.GoGzip},
		{Tar: testimage.PosixTar, Compression: testimage.Zstd},
		{Tar: testimage.GoTar, Compression: testimage.Zstd},
		{Tar: testimage.GoTar, Compression: testimage.Uncompressed},
		{Tar: testimage.GoTar, Compression: testimage.GoGzip, Docker: true},
		{Tar: testimage.GNUTar, Compression: testimage.Gzip9, Docker: true},
		{Tar: testimage.PosixTar, Compression: testimage.Uncompressed, Docker: true},
	}
	for _, s := range shapes {
		t.Run(s.String(), func(t *testing.T) {
			img := testimage.Build(t, testimage.Spec{Shape: s, Cmd: []string{"sh"}, Layers: payload()})
			checkManifest(t, img, s)
			ref := e.reg.Push(t, "shapes/"+s.String()+":1", img)
			e.pullRunRemove(t, pod, podCfg, s.String(), ref, testimage.ID(t, img), payloadChecks)
		})
	}

	// The same images in a pod with its own user namespace, where the
	// layers are seen through an idmapped mount: the owners and modes the
	// layers give, and the writes that copy files up. A file whose owner
	// is outside the pod's 65536 IDs shows as the overflow ID and can be
	// read, not changed (the kernel cannot store an unmapped owner in the
	// upper layer), as in containerd and CRI-O with idmapped layers.
	t.Run("Userns", func(t *testing.T) {
		upod, upodCfg := e.pod(t, UsernsPod(PodConfig("shapes-userns"), 0))
		layers := payload()
		layers[0] = append(layers[0], testimage.File{Path: "far", Content: []byte("far\n"), Mode: 0o644, UID: 70000, GID: 70000})
		checks := append(append([]string(nil), payloadChecks...), writeChecks...)
		checks = append(checks,
			`grep -q '^ *0 *[1-9][0-9]* *65536$' /proc/self/uid_map`, // a pod range, not the host's IDs
			`test "$(stat -c '%u %g' /far)" = "65534 65534"`,
			`test "$(cat /far)" = far`,
			`! echo more >>/far 2>/dev/null`,
		)
		for _, s := range []testimage.Shape{
			{Tar: testimage.GNUTar, Compression: testimage.Gzip9},
			{Tar: testimage.PosixTar, Compression: testimage.Zstd},
			{Tar: testimage.GoTar, Compression: testimage.GoGzip, Docker: true},
		} {
			t.Run(s.String(), func(t *testing.T) {
				img := testimage.Build(t, testimage.Spec{Shape: s, Cmd: []string{"sh"}, Layers: layers})
				ref := e.reg.Push(t, "shapes/userns-"+s.String()+":1", img)
				e.pullRunRemove(t, upod, upodCfg, "userns-"+s.String(), ref, testimage.ID(t, img), checks)
			})
		}
	})

	// The write checks hold outside a user namespace too.
	t.Run("Writes", func(t *testing.T) {
		img := testimage.Build(t, testimage.Spec{Shape: testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.Gzip1}, Cmd: []string{"sh"}, Layers: payload()})
		ref := e.reg.Push(t, "shapes/writes:1", img)
		e.pullRunRemove(t, pod, podCfg, "writes", ref, testimage.ID(t, img), writeChecks)
	})

	// Docker's most layers, 127, in a pod as it is and in one with a user
	// namespace, where every layer comes through the idmapped tree: more
	// lower dirs than one page of mount(2) options holds.
	t.Run("ManyLayers", func(t *testing.T) {
		const extra = 126 // on top of the busybox base layer
		var layers [][]testimage.File
		for i := range extra {
			layers = append(layers, []testimage.File{
				{Path: fmt.Sprintf("layer/%d", i), Content: []byte(fmt.Sprintf("%d\n", i)), Mode: 0o644},
				{Path: "top", Content: []byte(fmt.Sprintf("%d\n", i)), Mode: 0o644},
			})
		}
		img := testimage.Build(t, testimage.Spec{Shape: testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.Gzip1}, Cmd: []string{"sh"}, Layers: layers})
		ref := e.reg.Push(t, "shapes/many:1", img)
		checks := []string{
			fmt.Sprintf(`test "$(cat /top)" = %d`, extra-1),
			`test "$(cat /layer/0)" = 0`,
			fmt.Sprintf(`test "$(cat /layer/%d)" = %d`, extra/2, extra/2),
			fmt.Sprintf(`test "$(ls /layer | wc -l)" = %d`, extra),
			`echo changed >/layer/0 && test "$(cat /layer/0)" = changed`, // copied up from the bottom
		}
		upod, upodCfg := e.pod(t, UsernsPod(PodConfig("shapes-many-userns"), 0))
		if got := e.pull(t, ref); got != testimage.ID(t, img) {
			t.Fatalf("PullImage(%s) = %s, want %s", ref, got, testimage.ID(t, img))
		}
		if code, out := e.runChecks(t, pod, podCfg, "many", ref, checks); code != 0 {
			t.Errorf("checks in a %d-layer image exited %d:\n%s", extra+1, code, out)
		}
		userns := append(checks, `grep -q '^ *0 *[1-9][0-9]* *65536$' /proc/self/uid_map`)
		if code, out := e.runChecks(t, upod, upodCfg, "many-userns", ref, userns); code != 0 {
			t.Errorf("checks in a %d-layer image, user namespace pod, exited %d:\n%s", extra+1, code, out)
		}
		imgRemove(t, e.d, ref)
	})

	// A base image from one tool, layers on top from others.
	t.Run("MixedWriters", func(t *testing.T) {
		base := testimage.Build(t, testimage.Spec{Shape: testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.Zstd}, Cmd: []string{"sh"}})
		p := payload()
		img, err := mutate.AppendLayers(base,
			testimage.ShapedLayer(t, p[0], testimage.Shape{Tar: testimage.GoTar, Compression: testimage.Gzip1}),
			testimage.ShapedLayer(t, p[1], testimage.Shape{Tar: testimage.PosixTar, Compression: testimage.Uncompressed}))
		if err != nil {
			t.Fatal(err)
		}
		ref := e.reg.Push(t, "shapes/mixed:1", img)
		e.pullRunRemove(t, pod, podCfg, "mixed", ref, testimage.ID(t, img), payloadChecks)
	})

	t.Run("OCIIndexSingleArch", func(t *testing.T) {
		host := archImage(t, runtime.GOARCH, testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.GoGzip})
		ref := e.reg.PushIndex(t, "shapes/single:1", testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Image: host})
		e.checkIndexPull(t, pod, podCfg, "single", ref, host, nil)
	})
	t.Run("OCIIndexMultiArch", func(t *testing.T) {
		s := testimage.Shape{Tar: testimage.PosixTar, Compression: testimage.Zstd}
		host, foreign := archImage(t, runtime.GOARCH, s), archImage(t, foreignArch(), s)
		ref := e.reg.PushIndexAs(t, "shapes/multi:1", types.OCIImageIndex,
			testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: foreignArch()}, Image: foreign},
			testimage.PlatformImage{Platform: v1.Platform{OS: "unknown", Architecture: "unknown"}, Image: attestation(t, s)},
			testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Image: host})
		e.checkIndexPull(t, pod, podCfg, "multi", ref, host, []v1.Image{foreign})
	})
	t.Run("DockerManifestList", func(t *testing.T) {
		s := testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.Gzip9, Docker: true}
		host, foreign := archImage(t, runtime.GOARCH, s), archImage(t, foreignArch(), s)
		ref := e.reg.PushIndexAs(t, "shapes/list:1", types.DockerManifestList,
			testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: foreignArch(), Variant: "v8"}, Image: foreign},
			testimage.PlatformImage{Platform: v1.Platform{OS: "windows", Architecture: runtime.GOARCH, OSVersion: "10.0.17763.1"}, Image: attestation(t, s)},
			testimage.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, Image: host})
		e.checkIndexPull(t, pod, podCfg, "list", ref, host, []v1.Image{foreign})
	})

	t.Run("UserNameGroup", func(t *testing.T) {
		img := testimage.Build(t, testimage.Spec{
			Shape: testimage.Shape{Tar: testimage.GNUTar, Compression: testimage.Gzip9},
			Cmd:   []string{"sh"}, User: "app:appgrp",
			Layers: [][]testimage.File{{
				{Path: "etc/"},
				{Path: "etc/passwd", Content: []byte(testimage.Passwd + "app:x:4321:4322:app:/home/app:/bin/sh\n")},
				{Path: "etc/group", Content: []byte(testimage.Group + "appgrp:x:4322:\nother:x:4323:app\n")},
				{Path: "home/"}, {Path: "home/app/", Mode: 0o700, UID: 4321, GID: 4322},
			}},
		})
		ref := e.reg.Push(t, "shapes/user:1", img)
		id := e.pull(t, ref)
		resp := imgStatus(t, e.d, ref, true)
		if st := resp.Image; st.GetId() != id || st.Uid != nil || st.Username != "app" {
			t.Errorf("ImageStatus: id %s uid %v username %q, want %s, no uid, username app", st.GetId(), st.GetUid(), st.GetUsername(), id)
		}
		if !strings.Contains(resp.Info["info"], `"User":"app:appgrp"`) {
			t.Errorf("verbose info %q lacks the config's USER app:appgrp", resp.Info["info"])
		}
		e.pullRunRemove(t, pod, podCfg, "user", ref, id, []string{
			`test "$(id -u):$(id -g)" = 4321:4322`,
			`test "$(id -un):$(id -gn)" = app:appgrp`,
			`test "$HOME" = /home/app`,
			`touch /home/app/f && test "$(stat -c %u:%g /home/app/f)" = 4321:4322`,
			`grep -q '^Uid:[[:space:]]*4321[[:space:]]' /proc/self/status`,
			`grep -q '^Gid:[[:space:]]*4322[[:space:]]' /proc/self/status`,
		})
	})

	// Images that give a binary file capabilities instead of root (the
	// caddy image's `setcap cap_net_bind_service=+ep`), run as a user
	// that is not root. The layer carries the version 2 xattr a root
	// build writes; in a user namespace pod the kernel honours it only if
	// the rootfs is an idmapped mount whose owner 0 is the pod's root.
	// The same binary without the xattr must fail, so the checks can.
	t.Run("FileCapabilities", func(t *testing.T) {
		bind := testimage.GoProgram(t, bindLowPortProgram)
		img := testimage.Build(t, testimage.Spec{
			Shape: testimage.Shape{Tar: testimage.GoTar, Compression: testimage.GoGzip},
			Cmd:   []string{"sh"},
			Layers: [][]testimage.File{{
				{Path: "usr/"}, {Path: "usr/local/"}, {Path: "usr/local/bin/"},
				{Path: "usr/local/bin/withcap", Content: bind, Mode: 0o755, Xattrs: map[string]string{"security.capability": netBindServiceCap}},
				{Path: "usr/local/bin/nocap", Content: bind, Mode: 0o755},
			}},
		})
		ref := e.reg.Push(t, "shapes/filecaps:1", img)
		uid := int64(1000)
		checks := []string{
			`test "$(id -u)" = 1000`,
			`! grep -q '^CapEff:[[:space:]]*0*[1-9a-f]' /proc/self/status`, // the shell has no capability
			`withcap | grep -q '^bound 0.0.0.0:80$'`,
			`withcap | grep -q '^CapEff:[[:space:]]*0000000000000400$'`,
			`nocap | grep -q 'permission denied'`,
		}
		upod, upodCfg := e.pod(t, UsernsPod(PodConfig("filecaps-userns"), 0))
		for _, p := range []struct {
			name, id string
			cfg      *runtimeapi.PodSandboxConfig
		}{{"host", pod, podCfg}, {"userns", upod, upodCfg}} {
			t.Run(p.name, func(t *testing.T) {
				e.pull(t, ref)
				if code, out := e.runChecksAs(t, p.id, p.cfg, "filecaps-"+p.name, ref, &uid, checks); code != 0 {
					t.Errorf("checks exited %d:\n%s", code, out)
				}
			})
		}
		imgRemove(t, e.d, ref)
	})
}

// netBindServiceCap is a version 2 security.capability xattr (struct
// vfs_cap_data, little endian): effective, permitted CAP_NET_BIND_SERVICE.
var netBindServiceCap = string([]byte{
	0x01, 0x00, 0x00, 0x02, // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // permitted, inheritable: bit 10
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // capabilities 32-63
})

// bindLowPortProgram prints its effective capabilities and binds port 80.
const bindLowPortProgram = `package main

import (
	"fmt"
	"net"
	"os"
	"strings"
)

func main() {
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "CapEff:") {
			fmt.Println(l)
		}
	}
	l, err := net.Listen("tcp4", "0.0.0.0:80")
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("bound", l.Addr())
}
`

// checkManifest asserts img carries the media types s promises.
func checkManifest(t *testing.T, img v1.Image, s testimage.Shape) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	wantManifest, wantConfig := types.OCIManifestSchema1, types.OCIConfigJSON
	if s.Docker {
		wantManifest, wantConfig = types.DockerManifestSchema2, types.DockerConfigJSON
	}
	wantLayer, err := s.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != wantManifest || m.Config.MediaType != wantConfig {
		t.Errorf("manifest %s config %s, want %s %s", m.MediaType, m.Config.MediaType, wantManifest, wantConfig)
	}
	for i, l := range m.Layers {
		if l.MediaType != wantLayer {
			t.Errorf("layer %d: media type %s, want %s", i, l.MediaType, wantLayer)
		}
	}
}

// foreignArch is a platform the runtime must not pick.
func foreignArch() string {
	if runtime.GOARCH == "arm64" {
		return "amd64"
	}
	return "arm64"
}

// archImage is busybox plus payload() with /arch naming arch.
func archImage(t *testing.T, arch string, s testimage.Shape) v1.Image {
	t.Helper()
	layers := append(payload(), []testimage.File{{Path: "arch", Content: []byte(arch + "\n")}})
	return testimage.Build(t, testimage.Spec{Shape: s, Cmd: []string{"sh"}, Architecture: arch, Layers: layers})
}

// attestation stands for the entries build tools add to indexes that are
// no runnable image (buildx's "unknown/unknown" attestations, Windows).
func attestation(t *testing.T, s testimage.Shape) v1.Image {
	t.Helper()
	return testimage.Build(t, testimage.Spec{NoBusybox: true, Shape: s, Layers: [][]testimage.File{{{Path: "attestation.json", Content: []byte("{}\n")}}}})
}

// checkIndexPull pulls an index by digest: the runtime must pick host
// (and never fetch the foreign manifests), report the index digest as the
// repo digest, and run host's content.
func (e *ctrEnv) checkIndexPull(t *testing.T, pod string, podCfg *runtimeapi.PodSandboxConfig, name, ref string, host v1.Image, foreign []v1.Image) {
	t.Helper()
	id := testimage.ID(t, host)
	if got := e.pull(t, ref); got != id {
		t.Fatalf("PullImage(%s) = %s, want the %s image %s", ref, got, runtime.GOARCH, id)
	}
	if st := imgStatus(t, e.d, ref, false).Image; st == nil || !slices.Equal(st.RepoDigests, []string{ref}) {
		t.Errorf("ImageStatus(%s) = %v, want RepoDigests [%s] (the index digest)", ref, st, ref)
	}
	repo := strings.TrimPrefix(ref[:strings.Index(ref, "@")], e.reg.Addr+"/")
	for _, f := range foreign {
		d, err := f.Digest()
		if err != nil {
			t.Fatal(err)
		}
		if n := e.reg.Requests("GET /v2/" + repo + "/manifests/" + d.String()); n != 0 {
			t.Errorf("the %s manifest was fetched %d times, want never", foreignArch(), n)
		}
	}
	e.pullRunRemove(t, pod, podCfg, name, ref, id, append([]string{`test "$(cat /arch)" = ` + runtime.GOARCH}, payloadChecks...))
}

// noise is incompressible, reproducible data: a damaged byte in it lands
// in file content, not in a header the decoder would trip over first.
func noise(seed uint64, n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)}))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// twoLayersOnBusybox is busybox with a middle and a top layer of shape s,
// unique per seed; it returns the image and its top layer's digest.
func twoLayersOnBusybox(t *testing.T, seed uint64, s testimage.Shape) (v1.Image, string) {
	t.Helper()
	mid := testimage.ShapedLayer(t, []testimage.File{{Path: "mid", Content: noise(seed, 32<<10)}}, s)
	top := testimage.ShapedLayer(t, []testimage.File{{Path: "top", Content: noise(seed+1000, 512<<10)}}, s)
	img, err := mutate.AppendLayers(testimage.Busybox(t), mid, top)
	if err != nil {
		t.Fatal(err)
	}
	d, err := top.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return img, d.String()
}

// storeEntries lists what the image store holds on disk, to compare
// before and after a failed pull.
func storeEntries(t *testing.T, d *Daemon) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"blobs/sha256", "layers", "tmp"} {
		ents, err := os.ReadDir(filepath.Join(d.Root, "images", dir))
		if err != nil {
			t.Fatalf("reading the image store: %v", err)
		}
		for _, e := range ents {
			out = append(out, dir+"/"+e.Name())
		}
	}
	return out
}

// checkStoreAsBefore fails the test unless the image store holds exactly
// the entries it held before a failed pull: a failed pull rolls back
// every blob and layer it wrote, even the ones that checked out.
func checkStoreAsBefore(t *testing.T, d *Daemon, before []string) {
	t.Helper()
	left, lost := entriesDiff(before, storeEntries(t, d))
	if len(left) > 0 || len(lost) > 0 {
		t.Errorf("the failed pull left in images/: %v; and removed: %v", left, lost)
	}
}

// entriesDiff lists the store entries in after and not in before
// (left), and those in before and not in after (lost).
func entriesDiff(before, after []string) (left, lost []string) {
	for _, e := range after {
		if !slices.Contains(before, e) {
			left = append(left, e)
		}
	}
	for _, e := range before {
		if !slices.Contains(after, e) {
			lost = append(lost, e)
		}
	}
	return left, lost
}

// onBlob serves GETs of the blob digest with serve and passes every other
// request to the registry. serve gets the blob as the registry sent it.
func onBlob(digest string, serve func(w http.ResponseWriter, r *http.Request, hdr http.Header, body []byte)) func(http.Handler) http.Handler {
	return onGET("/blobs/"+digest, serve)
}

// onGET is onBlob for any path ending in suffix.
func onGET(suffix string, serve func(w http.ResponseWriter, r *http.Request, hdr http.Header, body []byte)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, suffix) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				panic(fmt.Sprintf("registry answered GET %s with %d", r.URL.Path, rec.Code))
			}
			serve(w, r, rec.Header(), rec.Body.Bytes())
		})
	}
}

// damaged sends damage(blob) in one go, with a Content-Length for the
// damaged size or chunked without one.
func damaged(damage func([]byte) []byte, chunked bool) func(http.ResponseWriter, *http.Request, http.Header, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, hdr http.Header, body []byte) {
		// However concurrently the layers are fetched, let the intact
		// ones land first: the failure must roll them back too.
		time.Sleep(500 * time.Millisecond)
		body = damage(bytes.Clone(body))
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		w.WriteHeader(http.StatusOK)
		if chunked {
			w.(http.Flusher).Flush() // headers out now, so no length is computed
		}
		_, _ = w.Write(body)
	}
}

// throttled sends the blob in chunks pieces, one every interval, and
// stops for good (until the client goes away or stop closes) after
// stallAfter pieces when stallAfter >= 0.
func throttled(chunks int, every time.Duration, stallAfter int, stop <-chan struct{}) func(http.ResponseWriter, *http.Request, http.Header, []byte) {
	return func(w http.ResponseWriter, r *http.Request, hdr http.Header, body []byte) {
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the headers arrive, whatever the body does
		size := (len(body) + chunks - 1) / chunks
		for i := 0; len(body) > 0; i++ {
			if i == stallAfter {
				select {
				case <-r.Context().Done():
				case <-stop:
				}
				return
			}
			n := min(size, len(body))
			if _, err := w.Write(body[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			body = body[n:]
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	}
}

func TestImagePullDamagedBlob(t *testing.T) {
	reg := testimage.StartRegistry(t)
	d := StartDaemon(t, Options{})
	// The busybox base is in the store already and must stay; the failed
	// pulls' own middle layers must not.
	imgPull(t, d, reg.Push(t, "base:1", testimage.Busybox(t)))
	flip := func(b []byte) []byte { b[len(b)/2] ^= 0x55; return b }
	cut := func(b []byte) []byte { return b[:len(b)/2] }
	damages := []struct {
		name    string
		damage  func([]byte) []byte
		chunked bool
	}{
		{"corrupted", flip, false},
		{"truncated", cut, false},
		{"truncated chunked", cut, true},
	}
	shapes := []testimage.Shape{
		{},
		{Tar: testimage.GNUTar, Compression: testimage.Zstd},
		{Tar: testimage.GNUTar, Compression: testimage.Uncompressed},
	}
	seed := uint64(0)
	for _, dm := range damages {
		for _, s := range shapes {
			seed++
			t.Run(dm.name+" "+s.String(), func(t *testing.T) {
				img, top := twoLayersOnBusybox(t, seed, s)
				ref := reg.Push(t, fmt.Sprintf("damaged/%d:1", seed), img)
				before := storeEntries(t, d)

				reg.Intercept(onBlob(top, damaged(dm.damage, dm.chunked)))
				_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
				reg.Intercept(nil)
				if status.Code(err) != codes.DataLoss || !strings.Contains(status.Convert(err).Message(), strings.TrimPrefix(top, "sha256:")) {
					t.Errorf("PullImage with the top layer %s = %v, want DataLoss naming %s", dm.name, err, top)
				}
				checkStoreAsBefore(t, d, before)
				if st := imgStatus(t, d, ref, false).Image; st != nil {
					t.Errorf("ImageStatus after the failed pull = %v, want nil", st)
				}
				// Nothing half-done blocks the next, intact pull.
				if got := imgPull(t, d, ref); got != testimage.ID(t, img) {
					t.Errorf("PullImage of the intact blob = %s, want %s", got, testimage.ID(t, img))
				}
				imgRemove(t, d, ref)
			})
		}
	}
}

// A pull that keeps receiving bytes is never cut short by
// pull_progress_timeout, however long it takes in all: it bounds stalls,
// not pulls, and no total bound applies unless pull_timeout is set.
func TestImagePullThrottled(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img, top := twoLayersOnBusybox(t, 1, testimage.Shape{})
	ref := reg.Push(t, "slow:1", img)
	d := StartDaemon(t, Options{Config: "[image]\npull_progress_timeout = \"2s\"\n"})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// 16 pieces 300ms apart: about 4.8s in all, no gap near 2s.
	reg.Intercept(onBlob(top, throttled(16, 300*time.Millisecond, -1, stop)))

	start := time.Now()
	got := imgPull(t, d, ref)
	took := time.Since(start)
	if got != testimage.ID(t, img) {
		t.Errorf("PullImage = %s, want %s", got, testimage.ID(t, img))
	}
	if took < 4*time.Second {
		t.Fatalf("the throttled pull took %v, want >= 4s: the throttle did not hold, the test proves nothing", took)
	}
	t.Logf("throttled pull took %v with pull_progress_timeout 2s", took.Round(time.Millisecond))
}

// pull_timeout, when configured, still bounds a whole pull, progress or
// not.
func TestImagePullTimeoutBoundsThrottled(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img, top := twoLayersOnBusybox(t, 2, testimage.Shape{})
	ref := reg.Push(t, "slow:1", img)
	d := StartDaemon(t, Options{Config: "[image]\npull_timeout = \"2s\"\n"})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// 16 pieces 1s apart: 16s in all, which leaves a loaded machine
	// plenty of time to end the pull at 2s and show it.
	reg.Intercept(onBlob(top, throttled(16, time.Second, -1, stop)))

	start := time.Now()
	_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	took := time.Since(start)
	if status.Code(err) != codes.Unavailable {
		t.Errorf("PullImage = %v after %v, want Unavailable from pull_timeout 2s", err, took)
	}
	if took > 10*time.Second {
		t.Errorf("PullImage took %v, want it cut at pull_timeout (2s), before the 16s transfer ended", took)
	}
	if got := imgList(t, d, ""); len(got) != 0 {
		t.Errorf("ListImages = %v, want none", got)
	}
}

// A registry that stops sending fails the pull after
// pull_progress_timeout, with a message that names the setting, and
// leaves nothing behind.
func TestImagePullStalled(t *testing.T) {
	reg := testimage.StartRegistry(t)
	d := StartDaemon(t, Options{Config: "[image]\npull_progress_timeout = \"2s\"\n"})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	// The registry accepts the request and never answers it.
	silent := func(w http.ResponseWriter, r *http.Request, _ http.Header, _ []byte) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}
	tests := []struct {
		name  string
		stall func(manifest, top string) func(http.Handler) http.Handler
	}{
		{"before the manifest's headers", func(manifest, _ string) func(http.Handler) http.Handler {
			return onGET("/manifests/"+manifest, silent)
		}},
		{"before the blob's body", func(_, top string) func(http.Handler) http.Handler {
			return onBlob(top, throttled(16, 100*time.Millisecond, 0, stop))
		}},
		{"mid-blob", func(_, top string) func(http.Handler) http.Handler {
			return onBlob(top, throttled(16, 100*time.Millisecond, 3, stop))
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, top := twoLayersOnBusybox(t, uint64(10+i), testimage.Shape{})
			ref := reg.Push(t, fmt.Sprintf("stall/%d:1", i), img)
			before := storeEntries(t, d)
			reg.Intercept(tc.stall(ref[strings.Index(ref, "@")+1:], top))
			start := time.Now()
			_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
			took := time.Since(start)
			reg.Intercept(nil)
			if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "pull_progress_timeout") {
				t.Errorf("stalled PullImage = %v, want Unavailable naming pull_progress_timeout", err)
			}
			if took < 2*time.Second || took > 15*time.Second {
				t.Errorf("stalled PullImage returned after %v, want soon after pull_progress_timeout (2s)", took)
			}
			checkStoreAsBefore(t, d, before)
			t.Logf("stalled %s: %v after %v", tc.name, status.Convert(err).Message(), took.Round(time.Millisecond))
		})
	}
}

// Two pulls of one reference at once, one with good credentials and one
// with bad, must each get their own answer: sharing the download must
// not share the authorization.
func TestImagePullCredentials(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Busybox(t)
	id := testimage.ID(t, img)
	reg.Push(t, "private/a:1", img)
	reg.Push(t, "private/b:1", img)
	d := StartDaemon(t, Options{})

	good := &runtimeapi.AuthConfig{Username: "alice", Password: "secret"}
	bad := &runtimeapi.AuthConfig{Username: "alice", Password: "wrong"}
	g := &credGate{}
	reg.Intercept(testimage.BasicAuth(good.Username, good.Password, func(r *http.Request) {
		if user, pass, ok := r.BasicAuth(); ok && strings.Contains(r.URL.Path, "/manifests/") {
			g.arrive(user + ":" + pass)
		}
	}))

	pull := func(ref string, auth *runtimeapi.AuthConfig) (string, error) {
		resp, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
		return resp.GetImageRef(), err
	}
	key := func(a *runtimeapi.AuthConfig) string { return a.Username + ":" + a.Password }
	tests := []struct {
		name          string
		repo          string
		first, second *runtimeapi.AuthConfig
		goodIs, badIs int // which of first (0) and second (1)
	}{
		{"good first", "private/a:1", good, bad, 0, 1},
		{"bad first", "private/b:1", bad, good, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			firstArrived := g.reset()
			var (
				wg   sync.WaitGroup
				refs [2]string
				errs [2]error
			)
			wg.Add(2)
			go func() { defer wg.Done(); refs[0], errs[0] = pull(reg.Ref(tc.repo), tc.first) }()
			// The second pull starts while the registry holds the first
			// one's manifest request.
			select {
			case <-firstArrived:
			case <-time.After(30 * time.Second):
				wg.Done() // no second pull
				wg.Wait()
				t.Fatalf("the first pull never asked for the manifest: %v", errs[0])
			}
			go func() { defer wg.Done(); refs[1], errs[1] = pull(reg.Ref(tc.repo), tc.second) }()
			wg.Wait()

			if errs[tc.goodIs] != nil || refs[tc.goodIs] != id {
				t.Errorf("pull with good credentials = %q, %v; want %s", refs[tc.goodIs], errs[tc.goodIs], id)
			}
			if status.Code(errs[tc.badIs]) != codes.Unauthenticated {
				t.Errorf("pull with bad credentials = %q, %v; want Unauthenticated", refs[tc.badIs], errs[tc.badIs])
			}
			if seen := g.seen(); seen[key(good)] == 0 || seen[key(bad)] == 0 {
				t.Errorf("manifest requests by credentials %v: each pull must reach the registry with its own", seen)
			}
		})
	}
}

// credGate holds the first manifest request until a request with other
// credentials arrives, or 3s pass: long enough that a second pull which
// joins the first one's download instead of asking for itself is caught
// in the act, without slowing down the pulls that do ask.
type credGate struct {
	mu     sync.Mutex
	counts map[string]int // manifest requests by "user:password"
	first  chan struct{}  // closed when the first request arrives
	both   chan struct{}  // closed when a second set of credentials arrives
}

// reset starts a round and returns the channel closed on its first
// request.
func (g *credGate) reset() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.counts = map[string]int{}
	g.first, g.both = make(chan struct{}), make(chan struct{})
	return g.first
}

func (g *credGate) arrive(creds string) {
	g.mu.Lock()
	g.counts[creds]++
	n := len(g.counts)
	first, both := g.first, g.both
	if n == 1 && g.counts[creds] == 1 {
		close(first)
	}
	if n == 2 && g.counts[creds] == 1 {
		close(both)
	}
	g.mu.Unlock()
	if n == 1 {
		select {
		case <-both:
		case <-time.After(3 * time.Second):
		}
	}
}

func (g *credGate) seen() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.counts)
}
