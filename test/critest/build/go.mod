module github.com/pinrt/pinrt/test/critest/build

go 1.26.8

require (
	github.com/onsi/ginkgo/v2 v2.32.1
	sigs.k8s.io/cri-tools v1.37.0
)

require (
	github.com/Masterminds/semver/v3 v3.4.0 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/google/pprof v0.0.0-20260402051712-545e8a4df936 // indirect
	golang.org/x/mod v0.38.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/tools v0.48.0 // indirect
)
