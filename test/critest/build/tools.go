//go:build tools

// Package build pins the cri-tools version critest and crictl are built
// from, and the ginkgo CLI critest runs for -parallel;
// test/critest/build.sh compiles all three from this module.
package build

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/cmd/critest"
)
