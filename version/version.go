// Package version holds the pinrt version. kubelet parses the CRI
// RuntimeVersion as a semantic version (k8s.io/apimachinery's
// ParseSemantic) and shows "Unknown" for anything else, so the version is
// always one: the build's `git describe`, set at build time with
//
//	-ldflags "-X github.com/pinrt/pinrt/version.describe=$(git describe --tags --match 'v[0-9]*' --always --dirty)"
//
// is turned into semver here, and a build without it (`go build`,
// `go install`, tests) falls back on the module version and the VCS
// stamp Go embeds.
package version

import (
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
)

// Name is what the runtime calls itself in the CRI Version RPC.
const Name = "pinrt"

// Base is the release the code is heading for: the version of a build
// made where no release tag is reachable (none exists yet).
const Base = "0.2.0"

// CRIVersion is the CRI API version pinrt serves.
const CRIVersion = "v1"

// describe is `git describe` of the build's commit, set by the Makefile.
var describe string

// Version is this build's semantic version, without a leading "v":
// "0.2.0" on a release tag, "0.2.1-dev.3+f5dcc36" three commits after it,
// "0.2.0-dev+f5dcc36.dirty" before any tag, from a modified tree.
var Version = resolve(describe, readBuildInfo())

// buildInfo is what Go's build stamp tells about the build.
type buildInfo struct {
	// module is the main module's version: "v0.2.0" when built by
	// `go install ...@v0.2.0`, "(devel)" or "" from a checkout.
	module   string
	revision string
	modified bool
}

func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildInfo{}
	}
	out := buildInfo{module: bi.Main.Version}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			out.revision = s.Value
		case "vcs.modified":
			out.modified = s.Value == "true"
		}
	}
	return out
}

var (
	// semverRE is semver 2.0.0 (numeric identifiers without leading
	// zeros), with an optional leading "v".
	semverRE = regexp.MustCompile(`^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)` +
		`(?:-((?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*))?` +
		`(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$`)
	// describeRE is `git describe --tags --long`-style output past a tag:
	// <tag>-<commits>-g<hash>[-dirty].
	describeRE = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]+)(-dirty)?$`)
	// hashRE is `git describe --always` where no tag is reachable.
	hashRE = regexp.MustCompile(`^([0-9a-f]{4,40})(-dirty)?$`)
	// unsafeRE is what may not appear in a semver build identifier.
	unsafeRE = regexp.MustCompile(`[^0-9A-Za-z-]+`)
)

// resolve turns a `git describe` (or a version given on the make command
// line) and the build stamp into a semantic version.
func resolve(desc string, bi buildInfo) string {
	desc = strings.TrimSpace(desc)
	dirty := strings.HasSuffix(desc, "-dirty")
	switch {
	case desc == "":
	case describeRE.MatchString(desc):
		// Before the semver case: "v0.2.0-3-gf5dcc36" is a valid semver
		// pre-release of 0.2.0, which this build comes after.
		m := describeRE.FindStringSubmatch(desc)
		if next, ok := nextPatch(m[1]); ok {
			return next + "-dev." + m[2] + "+" + buildID(m[3], m[4] != "")
		}
		return Base + "-dev+" + buildID(m[3], m[4] != "")
	case hashRE.MatchString(desc):
		m := hashRE.FindStringSubmatch(desc)
		return Base + "-dev+" + buildID(m[1], m[2] != "")
	case dirty && semverRE.MatchString(strings.TrimSuffix(desc, "-dirty")):
		// A release tag's tree, modified: that release's number, the
		// modification as build metadata. Before the semver case, which
		// would take "dirty" for a pre-release.
		return withBuild(strings.TrimPrefix(strings.TrimSuffix(desc, "-dirty"), "v"), "dirty")
	case semverRE.MatchString(desc):
		// A release tag, or a version given outright.
		return strings.TrimPrefix(desc, "v")
	default:
		// Anything else ("dev", a branch name) is kept as build metadata.
		return Base + "-dev+" + sanitize(desc)
	}
	// No description: `go install ...@v0.2.0` stamps the module version
	// (a pseudo-version is semver too); a checkout stamps the revision.
	if bi.module != "" && bi.module != "(devel)" && semverRE.MatchString(bi.module) {
		return withBuild(strings.TrimPrefix(bi.module, "v"), dirtyID(bi.modified))
	}
	if bi.revision != "" {
		return Base + "-dev+" + buildID(bi.revision, bi.modified)
	}
	return Base + "-dev"
}

// nextPatch is the version after tag vX.Y.Z: commits past a release are
// on their way to X.Y.(Z+1), so their pre-release sorts above the tag.
func nextPatch(tag string) (string, bool) {
	m := semverRE.FindStringSubmatch(tag)
	if m == nil {
		return "", false
	}
	patch, err := strconv.ParseUint(m[3], 10, 64)
	if err != nil {
		return "", false
	}
	if m[4] != "" {
		// Past a pre-release tag (v0.3.0-rc.1): still heading for 0.3.0.
		return m[1] + "." + m[2] + "." + m[3], true
	}
	return m[1] + "." + m[2] + "." + strconv.FormatUint(patch+1, 10), true
}

// buildID is a short commit hash, ".dirty" appended for a modified tree.
func buildID(hash string, dirty bool) string {
	if len(hash) > 12 {
		hash = hash[:12]
	}
	if dirty {
		return hash + ".dirty"
	}
	return hash
}

func dirtyID(dirty bool) string {
	if dirty {
		return "dirty"
	}
	return ""
}

// withBuild appends build metadata to a version that may have some.
func withBuild(v, meta string) string {
	switch {
	case meta == "":
		return v
	case strings.Contains(v, "+"):
		return v + "." + meta
	}
	return v + "+" + meta
}

// sanitize makes s a dot-separated list of semver build identifiers.
func sanitize(s string) string {
	var ids []string
	for _, p := range strings.Split(s, ".") {
		if p = strings.Trim(unsafeRE.ReplaceAllString(p, "-"), "-"); p != "" {
			ids = append(ids, p)
		}
	}
	if len(ids) == 0 {
		return "unknown"
	}
	return strings.Join(ids, ".")
}
