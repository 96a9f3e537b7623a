//go:build !linux

package cni

// usableNetNS: network namespaces exist only on Linux.
func usableNetNS(string) string { return "" }
