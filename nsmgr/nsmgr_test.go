package nsmgr

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"0f3c9d2e", true},
		{"pod_1.x-y", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{".", false},
		{"..", false},
		{"a..b", false},
		{".hidden", false},
		{"-rf", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a\x00", false},
	} {
		err := ValidateID(tc.id)
		if tc.ok && err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", tc.id, err)
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateID(%q) = %v, want InvalidArgument", tc.id, err)
		}
	}
}

func TestKindSet(t *testing.T) {
	if _, err := kindSet([]Kind{Net, "pid"}); err == nil || err.Error() != `unknown namespace kind "pid": invalid argument` {
		t.Errorf("kindSet with pid = %v", err)
	}
	if _, err := kindSet([]Kind{Net, Net}); err == nil || err.Error() != `namespace kind "net" listed twice: invalid argument` {
		t.Errorf("kindSet with duplicate = %v", err)
	}
}
