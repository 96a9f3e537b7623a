package nri

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/nri/pkg/adaptation/builtin"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"
)

// CheckFunc tries an adjustment on a copy of the container's spec; an
// error is what applying it for real would fail with.
type CheckFunc func(*api.ContainerAdjustment) error

type checkKey struct{}

// checker is pinrt's built-in validator. Plugins' adjustments are merged
// inside the adaptation; only a validator learns which plugin owns what.
// It runs the caller's CheckFunc (carried by the context of the
// CreateContainer call), so an adjustment pinrt cannot apply (a bad
// rlimit, an unknown CDI device, a mount without a destination) refuses
// the creation with the names of the plugins that made it.
func checker() *builtin.BuiltinPlugin {
	return &builtin.BuiltinPlugin{
		Base:  "pinrt-validator",
		Index: "01",
		Handlers: builtin.BuiltinHandlers{
			ValidateContainerAdjustment: func(ctx context.Context, req *api.ValidateContainerAdjustmentRequest) error {
				check, _ := ctx.Value(checkKey{}).(CheckFunc)
				if check == nil || req.GetAdjust() == nil || proto.Size(req.GetAdjust()) == 0 {
					return nil
				}
				if err := check(req.GetAdjust()); err != nil {
					return fmt.Errorf("adjustment by plugin(s) %s: %w", owners(req), err)
				}
				return nil
			},
		},
	}
}

// owners names the plugins that adjusted the container.
func owners(req *api.ValidateContainerAdjustmentRequest) string {
	set := map[string]bool{}
	if fo := req.GetOwners().GetOwners()[req.GetContainer().GetId()]; fo != nil {
		for _, p := range fo.GetSimple() {
			set[p] = true
		}
		for _, c := range fo.GetCompound() {
			for _, p := range c.GetOwners() {
				set[p] = true
			}
		}
	}
	names := make([]string, 0, len(set))
	for p := range set {
		names = append(names, fmt.Sprintf("%q", p))
	}
	if len(names) == 0 {
		return "(unknown)"
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
