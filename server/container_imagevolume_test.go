package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/oci"
)

const volImageID = "sha256:3333333333333333333333333333333333333333333333333333333333333333"

func withVolumeImage(t *testing.T, f *ctrFixture) {
	t.Helper()
	f.images.Registry["reg/tools:1"] = image.Image{ID: volImageID, RepoTags: []string{"reg/tools:1"}, RepoDigests: []string{"reg/tools@sha256:4444"}}
	if _, err := f.images.Pull(context.Background(), "reg/tools:1", nil); err != nil {
		t.Fatal(err)
	}
}

func imageMount(path, sub string, readonly bool) *runtimeapi.Mount {
	return &runtimeapi.Mount{ContainerPath: path, Image: &runtimeapi.ImageSpec{Image: "reg/tools:1"}, ImageSubPath: sub, Readonly: readonly}
}

func specMount(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestCreateContainerImageVolumes(t *testing.T) {
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			f := newCtrFixture(t)
			withVolumeImage(t, f)
			pod, _ := f.pod(t, userns)
			ctx := context.Background()
			cfg := unitCtr("c")
			cfg.Mounts = []*runtimeapi.Mount{imageMount("/tools", "", true), {HostPath: "/tmp", ContainerPath: "/scratch"}, imageMount("/etc/tools", "etc/conf.d", true)}
			if userns {
				f.rt.FeaturesResult = &oci.Features{IDMapMounts: true}
			}
			resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			id := resp.ContainerId
			sb, _ := f.srv.sandboxes.Get(pod)
			dir := f.srv.containerDir(id)
			wantReqs := []image.VolumeRequest{
				{ContainerID: id, PodID: pod, Index: 0, ImageID: volImageID, Dir: dir, UsernsPath: sb.Pins["user"]},
				{ContainerID: id, PodID: pod, Index: 2, ImageID: volImageID, Dir: dir, SubPath: "etc/conf.d", UsernsPath: sb.Pins["user"]},
			}
			if got := f.images.volumes[id]; !slices.Equal(got, wantReqs) {
				t.Errorf("volume requests %+v\nwant %+v", got, wantReqs)
			}
			spec := f.rt.Specs[id]
			for dest, src := range map[string]string{"/tools": filepath.Join(dir, "volumes/0/mnt"), "/etc/tools": filepath.Join(dir, "volumes/2/mnt/etc/conf.d")} {
				m := specMount(spec, dest)
				if m == nil || m.Source != src || !slices.Contains(m.Options, "ro") || len(m.UIDMappings) != 0 || len(m.GIDMappings) != 0 {
					t.Errorf("spec mount %s = %+v, want a read-only bind of %s without idmapping", dest, m, src)
				}
			}
			if m := specMount(spec, "/scratch"); m == nil || slices.Contains(m.Options, "ro") || (userns && len(m.UIDMappings) == 0) {
				t.Errorf("host volume %+v changed by the image volumes", m)
			}

			st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range st.Status.Mounts {
				got = append(got, fmt.Sprintf("%s host=%q ro=%v image=%s ref=%s sub=%q", m.ContainerPath, m.HostPath, m.Readonly, m.GetImage().GetImage(), m.GetImage().GetImageRef(), m.ImageSubPath))
			}
			want := []string{
				`/tools host="" ro=true image=reg/tools:1 ref=` + volImageID + ` sub=""`,
				`/scratch host="/tmp" ro=false image= ref= sub=""`,
				`/etc/tools host="" ro=true image=reg/tools:1 ref=` + volImageID + ` sub="etc/conf.d"`,
			}
			if !slices.Equal(got, want) {
				t.Errorf("status mounts\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}

			if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
				t.Fatal(err)
			}
			f.nothingLeft(t)
		})
	}
}

func TestCreateContainerImageVolumeErrors(t *testing.T) {
	tests := []struct {
		name   string
		mount  *runtimeapi.Mount
		inject func(f *ctrFixture)
		want   error
		msg    string
	}{
		{"image not pulled", &runtimeapi.Mount{ContainerPath: "/v", Image: &runtimeapi.ImageSpec{Image: "reg/absent:1"}, Readonly: true}, nil,
			errdefs.ErrNotFound, `image volume /v: image "reg/absent:1" must be pulled first`},
		{"relative container path", &runtimeapi.Mount{ContainerPath: "v", Image: &runtimeapi.ImageSpec{Image: "reg/tools:1"}, Readonly: true}, nil,
			errdefs.ErrInvalidArgument, `image volume container path "v" is not absolute`},
		{"host path as well", &runtimeapi.Mount{ContainerPath: "/v", HostPath: "/tmp", Image: &runtimeapi.ImageSpec{Image: "reg/tools:1"}, Readonly: true}, nil,
			errdefs.ErrInvalidArgument, "has a host path too"},
		{"writable", imageMount("/v", "", false), nil,
			errdefs.ErrInvalidArgument, "image volume /v must be read-only"},
		{"mount fails", imageMount("/v", "nope", true), func(f *ctrFixture) {
			f.images.VolumeErr, f.images.VolumeErrIndex = fmt.Errorf("image volume sub path \"nope\": %w", errdefs.ErrNotFound), 1
		}, errdefs.ErrNotFound, `image volume /v: image volume sub path "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			withVolumeImage(t, f)
			pod, _ := f.pod(t, true)
			if tc.inject != nil {
				tc.inject(f)
			}
			cfg := unitCtr("c")
			cfg.Mounts = []*runtimeapi.Mount{imageMount("/ok", "", true), tc.mount}
			_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			f.nothingLeft(t)
		})
	}
}
