package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/oci/ocitest"
)

// TestCreateContainerMountOptions sends mounts the way kubelet 1.37 does
// with volumeMounts[].bindMountOptions, and hostile ones.
func TestCreateContainerMountOptions(t *testing.T) {
	tests := []struct {
		name     string
		userns   bool
		mount    *runtimeapi.Mount
		wantSpec []string // the volume's OCI options
		wantStat []string // its options in ContainerStatus
		wantErr  error
		errWords []string // what the message must name
	}{
		{
			name:     "all three, as kubelet sends them",
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", MountOptions: []string{"noexec", "nodev", "nosuid"}},
			wantSpec: []string{"rbind", "rprivate", "noexec", "nodev", "nosuid"},
			wantStat: []string{"noexec", "nodev", "nosuid"},
		},
		{
			name:     "read-only with a repeat",
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", Readonly: true, MountOptions: []string{"noexec", "noexec"}},
			wantSpec: []string{"rbind", "rprivate", "ro", "noexec"},
			wantStat: []string{"noexec"},
		},
		{
			name:     "userns pod: idmapped volume",
			userns:   true,
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", MountOptions: []string{"nosuid"}},
			wantSpec: []string{"rbind", "rprivate", "nosuid"},
			wantStat: []string{"nosuid"},
		},
		{
			name:     "rw over a read-only volume",
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", Readonly: true, MountOptions: []string{"noexec", "rw"}},
			wantErr:  errdefs.ErrInvalidArgument,
			errWords: []string{`"rw"`, "/v"},
		},
		{
			name:     "propagation past kubelet's check",
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", MountOptions: []string{"rshared"}},
			wantErr:  errdefs.ErrInvalidArgument,
			errWords: []string{`"rshared"`, "/v"},
		},
		{
			name:     "suid",
			userns:   true,
			mount:    &runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v", MountOptions: []string{"suid"}},
			wantErr:  errdefs.ErrInvalidArgument,
			errWords: []string{`"suid"`, "/v"},
		},
		{
			name:     "on an image volume",
			mount:    &runtimeapi.Mount{ContainerPath: "/img", Image: &runtimeapi.ImageSpec{Image: "reg/tools:1"}, Readonly: true, MountOptions: []string{"remount"}},
			wantErr:  errdefs.ErrInvalidArgument,
			errWords: []string{`"remount"`, "/img"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCtrFixture(t)
			f.rt.FeaturesResult = &oci.Features{IDMapMounts: true}
			withVolumeImage(t, f)
			pod, _ := f.pod(t, tt.userns)
			cfg := unitCtr("c")
			cfg.Mounts = []*runtimeapi.Mount{tt.mount}
			ctx := context.Background()
			resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !containsAll(fmt.Sprint(err), tt.errWords) {
					t.Fatalf("err = %v, want %v naming %v", err, tt.wantErr, tt.errWords)
				}
				f.nothingLeft(t)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := specMount(f.rt.Specs[resp.ContainerId], "/v")
			if m == nil || !reflect.DeepEqual(m.Options, tt.wantSpec) {
				t.Fatalf("volume in the spec = %+v, want options %v", m, tt.wantSpec)
			}
			if tt.userns && len(m.UIDMappings) == 0 {
				t.Errorf("userns volume lost its idmapping: %+v", m)
			}
			st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Status.Mounts[0].MountOptions; !reflect.DeepEqual(got, tt.wantStat) {
				t.Errorf("status mount options %v, want %v", got, tt.wantStat)
			}
		})
	}
}

func TestCreateContainerImageVolumeNoexec(t *testing.T) {
	f := newCtrFixture(t)
	withVolumeImage(t, f)
	pod, _ := f.pod(t, false)
	cfg := unitCtr("c")
	m := imageMount("/tools", "", true)
	m.MountOptions = []string{"noexec"}
	cfg.Mounts = []*runtimeapi.Mount{m}
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	got := specMount(f.rt.Specs[resp.ContainerId], "/tools")
	if want := []string{"rbind", "ro", "rprivate", "nosuid", "nodev", "noexec"}; got == nil || !reflect.DeepEqual(got.Options, want) {
		t.Errorf("image volume = %+v, want options %v", got, want)
	}
}

// TestStatusMountOptionsFeature: kubelet reads one flag for the whole
// runtime, so it holds only when every advertised handler applies the
// options.
func TestStatusMountOptionsFeature(t *testing.T) {
	lacking := &oci.Features{MountOptions: []string{"rbind", "ro", "nodev", "nosuid"}}
	full := &oci.Features{MountOptions: append(append([]string{}, lacking.MountOptions...), "noexec")}
	tests := []struct {
		name   string
		runc   *oci.Features
		other  *oci.Features // a second handler, "kata"; nil for none
		broken bool          // kata's probe fails: it is not advertised
		want   bool
	}{
		{name: "runc listing them", runc: full, want: true},
		{name: "runtime without a features list", runc: nil, want: true},
		{name: "runc lacking noexec", runc: lacking, want: false},
		{name: "one of two lacking", runc: full, other: lacking, want: false},
		{name: "the lacking one is not advertised", runc: full, other: lacking, broken: true, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCtrFixture(t)
			f.rt.FeaturesResult = tt.runc
			if tt.other != nil {
				kata := ocitest.New()
				kata.FeaturesResult = tt.other
				if tt.broken {
					kata.ProbeErr = fmt.Errorf("broken: %w", errdefs.ErrFailedPrecondition)
				}
				f.srv.deps.Runtimes["kata"] = kata
				f.cfg.Runtime.Runtimes["kata"] = conf.Handler{Binary: "kata"}
			}
			resp, err := f.srv.Status(context.Background(), &runtimeapi.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetFeatures().GetMountOptions(); got != tt.want {
				t.Errorf("features.mount_options = %v, want %v", got, tt.want)
			}
			if !resp.GetFeatures().GetSupplementalGroupsPolicy() {
				t.Error("supplemental_groups_policy dropped")
			}
		})
	}
}

func TestStatusNoHandlerNoMountOptions(t *testing.T) {
	f := newCtrFixture(t)
	f.rt.ProbeErr = fmt.Errorf("broken: %w", errdefs.ErrFailedPrecondition)
	resp, err := f.srv.Status(context.Background(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.RuntimeHandlers) != 0 || resp.GetFeatures().GetMountOptions() {
		t.Errorf("handlers %v, mount_options %v; want none and false", resp.RuntimeHandlers, resp.GetFeatures().GetMountOptions())
	}
}

func containsAll(s string, words []string) bool {
	for _, w := range words {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}
