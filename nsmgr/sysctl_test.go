package nsmgr

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

func TestNormalizeSysctl(t *testing.T) {
	for in, want := range map[string]string{
		"net.ipv4.ip_forward":              "net.ipv4.ip_forward",
		"net/ipv4/ip_forward":              "net.ipv4.ip_forward",
		"net/ipv4/conf/eth0.100/rp_filter": "net.ipv4.conf.eth0/100.rp_filter",
		"net.ipv4.conf.eth0/100.rp_filter": "net.ipv4.conf.eth0/100.rp_filter",
		"kernel":                           "kernel",
	} {
		if got := NormalizeSysctl(in); got != want {
			t.Errorf("NormalizeSysctl(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := sysctlPath("net.ipv4.conf.eth0/100.rp_filter"), "net/ipv4/conf/eth0.100/rp_filter"; got != want {
		t.Errorf("sysctlPath = %q, want %q", got, want)
	}
}

func TestValidateSysctls(t *testing.T) {
	for _, tc := range []struct {
		name           string
		sysctls        map[string]string
		podNet, podIPC bool
		want           string // "" means valid
	}{
		{"none", nil, false, false, ""},
		{"net in pod netns", map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"}, true, false, ""},
		{"net slash form", map[string]string{"net/ipv4/conf/eth0.100/rp_filter": "1"}, true, false, ""},
		{"kernel.shmmax", map[string]string{"kernel.shmmax": "1"}, false, true, ""},
		{"kernel.shm_rmid_forced", map[string]string{"kernel.shm_rmid_forced": "1"}, false, true, ""},
		{"kernel.msgmax", map[string]string{"kernel.msgmax": "1"}, false, true, ""},
		{"kernel.sem", map[string]string{"kernel.sem": "250 32000 32 128"}, false, true, ""},
		{"fs.mqueue", map[string]string{"fs.mqueue.msg_max": "10"}, false, true, ""},
		{"net with host netns", map[string]string{"net.ipv4.ip_forward": "1"}, false, true,
			`sysctl "net.ipv4.ip_forward" needs a pod network namespace, the pod uses the host's: invalid argument`},
		{"ipc with host ipc", map[string]string{"kernel.shmmax": "1"}, true, false,
			`sysctl "kernel.shmmax" needs a pod IPC namespace, the pod uses the host's: invalid argument`},
		{"fs.mqueue with host ipc", map[string]string{"fs/mqueue/msg_max": "1"}, true, false,
			`sysctl "fs/mqueue/msg_max" needs a pod IPC namespace, the pod uses the host's: invalid argument`},
		{"not namespaced", map[string]string{"kernel.hostname": "x"}, true, true,
			`sysctl "kernel.hostname" is not namespaced and would change the host: invalid argument`},
		{"kernel.semfoo is not kernel.sem", map[string]string{"kernel.semmni": "1"}, true, true,
			`sysctl "kernel.semmni" is not namespaced and would change the host: invalid argument`},
		{"vm", map[string]string{"vm.swappiness": "1"}, true, true,
			`sysctl "vm.swappiness" is not namespaced and would change the host: invalid argument`},
		{"dotdot in slash form", map[string]string{"net/../../kernel/hostname": "x"}, true, true,
			`sysctl "net/../../kernel/hostname": malformed name: invalid argument`},
		{"dotdot in dot form", map[string]string{"net.ipv4.conf./../x": "1"}, true, true,
			`sysctl "net.ipv4.conf./../x": malformed name: invalid argument`},
		{"empty component", map[string]string{"net..ipv4": "1"}, true, true,
			`sysctl "net..ipv4": malformed name: invalid argument`},
		{"trailing separator", map[string]string{"net.ipv4.": "1"}, true, true,
			`sysctl "net.ipv4.": malformed name: invalid argument`},
		{"empty", map[string]string{"": "1"}, true, true,
			`sysctl "": malformed name: invalid argument`},
		{"equals sign", map[string]string{"net.a=b": "1"}, true, true,
			`sysctl "net.a=b": invalid character '=': invalid argument`},
		{"space", map[string]string{"net.a b": "1"}, true, true,
			`sysctl "net.a b": invalid character ' ': invalid argument`},
		{"NUL in value", map[string]string{"net.ipv4.ip_forward": "1\x00"}, true, true,
			`sysctl "net.ipv4.ip_forward": value "1\x00" contains a newline or NUL: invalid argument`},
		{"newline in value", map[string]string{"net.ipv4.ip_forward": "1\n0"}, true, true,
			`sysctl "net.ipv4.ip_forward": value "1\n0" contains a newline or NUL: invalid argument`},
		{"tab in value is a separator", map[string]string{"net.ipv4.ip_local_port_range": "32768\t60999"}, true, true, ""},
		{"first invalid in sorted order", map[string]string{"vm.b": "1", "kernel.a": "1", "net.ok": "1"}, true, true,
			`sysctl "kernel.a" is not namespaced and would change the host: invalid argument`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSysctls(tc.sysctls, tc.podNet, tc.podIPC)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("ValidateSysctls = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("ValidateSysctls = %v, want %q", err, tc.want)
			}
		})
	}
}
