package oci

import (
	"path"
	"strings"
	"testing"
)

// A volume at a parent of the pod's files (/etc) or of a default mount
// (/dev) must be mounted before them, or it hides them: a ConfigMap at
// /etc would take the pod's resolv.conf and hostname away. containerd
// sorts its own files in with the CRI mounts for the same reason.
func TestVolumeDoesNotHidePodFiles(t *testing.T) {
	s, err := gen(t,
		WithPodFiles("/pod/hosts", "/pod/resolv.conf", "/pod/hostname", "/pod/shm", false),
		WithMounts([]Mount{
			{HostPath: "/h/etc", ContainerPath: "/etc"},
			{HostPath: "/h/mqueue", ContainerPath: "/dev/mqueue/"},
		}, false, nil, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	for i, m := range s.Mounts {
		at[m.Destination] = i
	}
	for _, m := range s.Mounts {
		for parent := path.Dir(m.Destination); parent != "/"; parent = path.Dir(parent) {
			if j, ok := at[parent]; ok && j > at[m.Destination] {
				t.Errorf("%s (mount %d) comes after its child %s (mount %d), hiding it", parent, j, m.Destination, at[m.Destination])
			}
		}
	}
	if i, ok := at["/etc/resolv.conf"]; !ok || !strings.HasPrefix(s.Mounts[i].Source, "/pod/") {
		t.Errorf("mounts = %+v, want /pod/resolv.conf at /etc/resolv.conf", s.Mounts)
	}
}
