package oci

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidMountOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    []string
		want    []string
		wantErr string // the option the error must name; "" for none
	}{
		{name: "none", opts: nil, want: nil},
		{name: "empty list", opts: []string{}, want: nil},
		{name: "all three as kubelet sends them", opts: []string{"noexec", "nodev", "nosuid"}, want: []string{"noexec", "nodev", "nosuid"}},
		{name: "repeats collapse", opts: []string{"nosuid", "nosuid", "noexec", "nosuid"}, want: []string{"nosuid", "noexec"}},
		// What only loosens a volume, or has a CRI field of its own.
		{name: "exec clears a host flag", opts: []string{"exec"}, wantErr: "exec"},
		{name: "suid", opts: []string{"nodev", "suid"}, wantErr: "suid"},
		{name: "dev", opts: []string{"dev"}, wantErr: "dev"},
		{name: "rw over a read-only volume", opts: []string{"noexec", "rw"}, wantErr: "rw"},
		{name: "ro has its field", opts: []string{"ro"}, wantErr: "ro"},
		{name: "rro has its field", opts: []string{"rro"}, wantErr: "rro"},
		{name: "bind would drop submounts", opts: []string{"bind"}, wantErr: "bind"},
		{name: "rbind", opts: []string{"rbind"}, wantErr: "rbind"},
		{name: "remount", opts: []string{"remount"}, wantErr: "remount"},
		{name: "propagation", opts: []string{"rshared"}, wantErr: "rshared"},
		{name: "shared", opts: []string{"shared"}, wantErr: "shared"},
		{name: "recursive variant", opts: []string{"rnoexec"}, wantErr: "rnoexec"},
		{name: "idmap", opts: []string{"idmap"}, wantErr: "idmap"},
		{name: "case matters", opts: []string{"NOEXEC"}, wantErr: "NOEXEC"},
		{name: "comma list is one option", opts: []string{"noexec,rw"}, wantErr: "noexec,rw"},
		{name: "padded", opts: []string{" noexec"}, wantErr: " noexec"},
		{name: "empty string", opts: []string{""}, wantErr: `""`},
		{name: "fs data", opts: []string{"size=1g"}, wantErr: "size=1g"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ValidMountOptions("/vol", tt.opts)
			if tt.wantErr == "" {
				if err != nil || !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got (%q, %v), want (%q, nil)", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "/vol") {
				t.Fatalf("err = %v, want InvalidArgument naming %s and the mount /vol", err, tt.wantErr)
			}
			if got != nil {
				t.Errorf("options %q returned with the error", got)
			}
		})
	}
}

func TestAppliesVolumeMountOptions(t *testing.T) {
	runc, err := os.ReadFile("testdata/runc-features.json")
	if err != nil {
		t.Fatal(err)
	}
	fromRunc, err := ParseFeatures(runc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    *Features
		want bool
	}{
		{"runc's features", fromRunc, true},
		{"no features command", &Features{}, true},
		{"features without a mountOptions list", &Features{Raw: fromRunc.Raw, MountOptions: nil}, true},
		{"a list without noexec", &Features{MountOptions: []string{"rbind", "nodev", "nosuid"}}, false},
		{"an empty list", &Features{MountOptions: []string{}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.AppliesVolumeMountOptions(); got != tt.want {
				t.Errorf("AppliesVolumeMountOptions = %v, want %v", got, tt.want)
			}
		})
	}
}
