package nsmgr

import "testing"

func TestCheckSysctlPath(t *testing.T) {
	tests := []struct {
		path string
		want string // "" for accepted
	}{
		{"net/ipv4/ip_forward", ""},
		{"net/ipv4/conf/eth0.100/rp_filter", ""},
		{"kernel/shm_rmid_forced", ""},
		{"net/../../etc/passwd", "malformed name"},
		{"net//x", "malformed name"},
		{"/net/x", "malformed name"},
		{"net/a=b", "invalid character '='"},
		{"net/a b", "invalid character ' '"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			err := checkSysctlPath(tc.path)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
				t.Fatalf("checkSysctlPath(%q) = %v, want %q", tc.path, err, tc.want)
			}
		})
	}
}
