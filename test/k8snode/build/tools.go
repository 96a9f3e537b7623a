//go:build tools

// The programs build.sh builds beside the node binary, from this module
// so their versions are the pinned release's: the ginkgo CLI that runs
// the conformance suite in parallel, and agnhost, the Kubernetes e2e
// images' test server (test/standin wraps it in a stand-in image).
package main

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
