package nshelper

import (
	"reflect"
	"syscall"
	"testing"
)

func TestParseIDMap(t *testing.T) {
	tests := []struct {
		name, in string
		want     []syscall.SysProcIDMap // nil: refused
	}{
		{"one range", "0:100000:65536", []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}},
		{"two ranges", "0:1000:1,1:200000:65535", []syscall.SysProcIDMap{{HostID: 1000, Size: 1}, {ContainerID: 1, HostID: 200000, Size: 65535}}},
		{"empty", "", nil},
		{"two fields", "0:1000", nil},
		{"negative", "0:-1:1", nil},
		{"above 32 bits", "0:4294967296:1", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseIDMap(tc.in)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("ParseIDMap(%q) = %v, want an error", tc.in, got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseIDMap(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
			if s := FormatIDMap(got); s != tc.in {
				t.Fatalf("FormatIDMap = %q, want %q", s, tc.in)
			}
		})
	}
}
