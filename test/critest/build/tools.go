//go:build tools

// Package build pins the cri-tools version critest is built from; build.sh
// compiles its cmd/critest test binary from this module.
package build

import _ "sigs.k8s.io/cri-tools/cmd/critest"
