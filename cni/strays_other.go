//go:build !linux

package cni

import "context"

func killStrays(context.Context, string) (int, error) { return 0, nil }
