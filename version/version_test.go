package version

import (
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name string
		desc string
		bi   buildInfo
		want string
	}{
		{name: "release tag", desc: "v0.2.0", want: "0.2.0"},
		{name: "release tag dirty", desc: "v0.2.0-dirty", want: "0.2.0+dirty"},
		{name: "past a tag", desc: "v0.2.0-3-gf5dcc36", want: "0.2.1-dev.3+f5dcc36"},
		{name: "past a tag dirty", desc: "v0.2.0-3-gf5dcc36-dirty", want: "0.2.1-dev.3+f5dcc36.dirty"},
		{name: "past a pre-release tag", desc: "v0.3.0-rc.1-12-gabcdef0", want: "0.3.0-dev.12+abcdef0"},
		{name: "past a tag that is no version", desc: "nightly-5-gabcdef0", want: Base + "-dev+abcdef0"},
		{name: "no tag", desc: "f5dcc36", want: Base + "-dev+f5dcc36"},
		{name: "no tag dirty", desc: "f5dcc36-dirty", want: Base + "-dev+f5dcc36.dirty"},
		{name: "version given outright", desc: "1.4.2-rc.1+build.7", want: "1.4.2-rc.1+build.7"},
		{name: "not a version", desc: "dev", want: Base + "-dev+dev"},
		{name: "hostile", desc: "my branch/ü+x..y", want: Base + "-dev+my-branch-x.y"},
		{name: "nothing to keep", desc: "++", want: Base + "-dev+unknown"},
		{name: "leading zero is no semver", desc: "v01.2.3", want: Base + "-dev+v01.2.3"},
		{name: "go install at a tag", bi: buildInfo{module: "v0.2.0"}, want: "0.2.0"},
		{name: "go install at a pseudo-version", bi: buildInfo{module: "v0.0.0-20261125140000-f5dcc36a1b2c"}, want: "0.0.0-20261125140000-f5dcc36a1b2c"},
		{name: "go build in a checkout", bi: buildInfo{module: "(devel)", revision: "f5dcc36a1b2c3d4e5f60718293a4b5c6d7e8f901"}, want: Base + "-dev+f5dcc36a1b2c"},
		{name: "go build in a modified checkout", bi: buildInfo{module: "(devel)", revision: "f5dcc36a1b2c3d4e5f60718293a4b5c6d7e8f901", modified: true}, want: Base + "-dev+f5dcc36a1b2c.dirty"},
		{name: "no stamp at all", want: Base + "-dev"},
		{name: "description wins over stamp", desc: "v0.2.0", bi: buildInfo{module: "v9.9.9", revision: "abc"}, want: "0.2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.desc, tc.bi)
			if got != tc.want {
				t.Errorf("resolve(%q, %+v) = %q, want %q", tc.desc, tc.bi, got, tc.want)
			}
			// kubelet's own parser (pkg/kubelet/kuberuntime) decides
			// whether the node shows the version or "Unknown".
			if _, err := utilversion.ParseSemantic(got); err != nil {
				t.Errorf("%q is not semver to kubelet: %v", got, err)
			}
		})
	}
}

// TestVersionOfThisBuild checks what the test binary itself resolved
// (no ldflags: the build stamp or Base).
func TestVersionOfThisBuild(t *testing.T) {
	v, err := utilversion.ParseSemantic(Version)
	if err != nil {
		t.Fatalf("Version %q is not semver: %v", Version, err)
	}
	base := utilversion.MustParseSemantic(Base)
	if v.Major() != base.Major() || v.Minor() != base.Minor() {
		t.Errorf("Version %q is not a %s build", Version, Base)
	}
}

func TestNextPatchSortsAfterTag(t *testing.T) {
	tag := utilversion.MustParseSemantic("0.2.0")
	next := utilversion.MustParseSemantic(resolve("v0.2.0-1-gabcdef0", buildInfo{}))
	if !tag.LessThan(next) {
		t.Errorf("%s does not sort after %s", next, tag)
	}
	base := utilversion.MustParseSemantic(Base)
	dev := utilversion.MustParseSemantic(resolve("abcdef0", buildInfo{}))
	if !dev.LessThan(base) {
		t.Errorf("%s does not sort before the release %s", dev, base)
	}
}
