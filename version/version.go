// Package version holds the pinrt version, set at build time with
// -ldflags "-X github.com/pinrt/pinrt/version.Version=...".
package version

// Name is what the runtime calls itself in the CRI Version RPC.
const Name = "pinrt"

// Version is the release or git description of this build.
var Version = "dev"

// CRIVersion is the CRI API version pinrt serves.
const CRIVersion = "v1"
