package test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// A verbose ImageStatus carries the whole image config and chain IDs, as
// containerd's does; image.pinned_images pins by name and by prefix, and
// an explicit RemoveImage still removes a pinned image.
func TestImageStatusVerboseAndPinned(t *testing.T) {
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{
		// The host's architecture, as a real image for this node has;
		// testimage defaults to amd64.
		Architecture: runtime.GOARCH,
		Entrypoint:   []string{"/bin/sh", "-c"}, Cmd: []string{"sleep 1"}, User: "1002",
		Labels: map[string]string{"e2e": "verbose"},
		Layers: [][]testimage.File{{{Path: "etc/motd", Content: []byte("hi\n")}}},
	})
	pinnedRef := reg.Push(t, "pinned/app:1", img)
	other := reg.Push(t, "plain:1", testimage.Busybox(t))
	d := StartDaemon(t, Options{Config: fmt.Sprintf("[image]\npinned_images = [%q]\n", reg.Addr+"/pinned/*")})
	id := imgPull(t, d, reg.Ref("pinned/app:1"))
	otherID := imgPull(t, d, other)

	resp := imgStatus(t, d, pinnedRef, true)
	if !resp.Image.GetPinned() {
		t.Errorf("ImageStatus(%s).Pinned = false under pattern %s/pinned/*", pinnedRef, reg.Addr)
	}
	var info struct {
		ChainID   string        `json:"chainID"`
		ChainIDs  []string      `json:"chainIDs"`
		Pinned    bool          `json:"pinned"`
		ImageSpec v1.ConfigFile `json:"imageSpec"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("verbose info: %v\n%s", err, resp.Info["info"])
	}
	cf := info.ImageSpec
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || cf.Config.User != "1002" ||
		!slices.Equal(cf.Config.Entrypoint, []string{"/bin/sh", "-c"}) || cf.Config.Labels["e2e"] != "verbose" ||
		len(cf.RootFS.DiffIDs) != 2 || len(cf.History) != 2 {
		t.Errorf("imageSpec = %+v, want the pushed config", cf)
	}
	if len(info.ChainIDs) != 2 || info.ChainID != info.ChainIDs[1] || !info.Pinned {
		t.Errorf("chainID %q chainIDs %v pinned %v, want the top of two and pinned", info.ChainID, info.ChainIDs, info.Pinned)
	}

	list := imgList(t, d, "")
	if !list[id].GetPinned() || list[otherID].GetPinned() {
		t.Errorf("ListImages pinned: %s %v, %s %v; want only the first", id, list[id].GetPinned(), otherID, list[otherID].GetPinned())
	}
	imgRemove(t, d, pinnedRef)
	if st := imgStatus(t, d, id, false); st.Image != nil {
		t.Errorf("pinned image still present after RemoveImage: %v", st.Image)
	}
}
