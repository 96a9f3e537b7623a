package oci

import (
	"errors"
	"reflect"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestWithImageVolumes(t *testing.T) {
	ro := []string{"rbind", "ro", "rprivate", "nosuid", "nodev"}
	tests := []struct {
		name    string
		before  []specs.Mount
		vols    []ImageVolume
		want    []specs.Mount
		wantErr error
	}{
		{
			name: "read-only bind without idmapping",
			vols: []ImageVolume{{Source: "/v/0/mnt/", ContainerPath: "/img"}},
			want: []specs.Mount{{Destination: "/img", Type: "bind", Source: "/v/0/mnt", Options: ro}},
		},
		{
			name:   "after unrelated volumes",
			before: []specs.Mount{{Destination: "/data", Type: "bind", Source: "/h"}},
			vols:   []ImageVolume{{Source: "/v/0/mnt/etc", ContainerPath: "/cfg"}},
			want: []specs.Mount{
				{Destination: "/data", Type: "bind", Source: "/h"},
				{Destination: "/cfg", Type: "bind", Source: "/v/0/mnt/etc", Options: ro},
			},
		},
		{
			name:   "parent of a volume goes first",
			before: []specs.Mount{{Destination: "/proc", Type: "proc"}, {Destination: "/img/sub", Type: "bind", Source: "/h"}},
			vols:   []ImageVolume{{Source: "/v/0/mnt", ContainerPath: "/img"}},
			want: []specs.Mount{
				{Destination: "/proc", Type: "proc"},
				{Destination: "/img", Type: "bind", Source: "/v/0/mnt", Options: ro},
				{Destination: "/img/sub", Type: "bind", Source: "/h"},
			},
		},
		{
			name:   "replaces a mount at the same place",
			before: []specs.Mount{{Destination: "/img", Type: "tmpfs", Source: "tmpfs"}},
			vols:   []ImageVolume{{Source: "/v/0/mnt", ContainerPath: "/img/"}},
			want:   []specs.Mount{{Destination: "/img", Type: "bind", Source: "/v/0/mnt", Options: ro}},
		},
		{
			name: "noexec added, nosuid/nodev not repeated",
			vols: []ImageVolume{{Source: "/v/0/mnt", ContainerPath: "/img", Options: []string{"nosuid", "noexec", "nodev"}}},
			want: []specs.Mount{{Destination: "/img", Type: "bind", Source: "/v/0/mnt", Options: append(ro[:len(ro):len(ro)], "noexec")}},
		},
		{name: "option not allowed", vols: []ImageVolume{{Source: "/v", ContainerPath: "/img", Options: []string{"rw"}}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "relative source", vols: []ImageVolume{{Source: "v", ContainerPath: "/img"}}, wantErr: errdefs.ErrInvalidArgument},
		{name: "relative destination", vols: []ImageVolume{{Source: "/v", ContainerPath: "img"}}, wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := generatorFor(&specs.Spec{Linux: &specs.Linux{}, Mounts: tt.before})
			err := WithImageVolumes(tt.vols, nil)(g)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(g.Config.Mounts, tt.want) {
				t.Errorf("mounts = %+v\nwant %+v", g.Config.Mounts, tt.want)
			}
		})
	}
}
