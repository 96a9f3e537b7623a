package oci

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCheckLogPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"", true},
		{"/var/log/pods/ns_p_u/c/0.log", true},
		{"/var/log/pods/ünï/cöde.log", true},
		{"var/log/pods/c/0.log", false},
		{"0.log", false},
		// conmon's -l is driver:path: it would open /var/log/pods/p.
		{"/var/log/pods/p:q/0.log", false},
		{"/var/log/pods/p/:", false},
	} {
		err := CheckLogPath(tc.path)
		if tc.ok && err != nil {
			t.Errorf("CheckLogPath(%q) = %v, want nil", tc.path, err)
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckLogPath(%q) = %v, want invalid argument", tc.path, err)
		}
	}
}
