package server

import (
	"errors"
	"math"
	"testing"

	"github.com/containerd/errdefs"
)

func TestPodBandwidth(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		in, out uint64
		none    bool
		err     error
	}{
		{name: "none", ann: map[string]string{"other": "x"}, none: true},
		{name: "decimal", ann: map[string]string{annotationIngressBandwidth: "10M"}, in: 10_000_000},
		{name: "binary and plain", ann: map[string]string{annotationIngressBandwidth: "1Ki", annotationEgressBandwidth: "5000"}, in: 1024, out: 5000},
		{name: "giga", ann: map[string]string{annotationEgressBandwidth: "2G"}, out: 2_000_000_000},
		{name: "garbage", ann: map[string]string{annotationIngressBandwidth: "fast"}, err: errdefs.ErrInvalidArgument},
		{name: "zero", ann: map[string]string{annotationEgressBandwidth: "0"}, err: errdefs.ErrInvalidArgument},
		{name: "negative", ann: map[string]string{annotationEgressBandwidth: "-1M"}, err: errdefs.ErrInvalidArgument},
		{name: "overflow", ann: map[string]string{annotationEgressBandwidth: "18446744073709551615T"}, err: errdefs.ErrInvalidArgument},
		// Any resource quantity, as containerd parses them
		// (resource.ParseQuantity), within its 1k to 1P bounds.
		{name: "fraction", ann: map[string]string{annotationIngressBandwidth: "1.5M"}, in: 1_500_000},
		{name: "exponent", ann: map[string]string{annotationEgressBandwidth: "25e6"}, out: 25_000_000},
		{name: "peta", ann: map[string]string{annotationEgressBandwidth: "1P"}, out: 1_000_000_000_000_000},
		{name: "milli rounds up", ann: map[string]string{annotationEgressBandwidth: "1000001m"}, out: 1001},
		{name: "under 1k", ann: map[string]string{annotationIngressBandwidth: "999"}, err: errdefs.ErrInvalidArgument},
		{name: "over 1P", ann: map[string]string{annotationIngressBandwidth: "2P"}, err: errdefs.ErrInvalidArgument},
		{name: "binary peta over 1P", ann: map[string]string{annotationIngressBandwidth: "1Pi"}, err: errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bw, err := podBandwidth(tc.ann)
			if tc.err != nil || err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if tc.none {
				if bw != nil {
					t.Fatalf("bandwidth = %+v, want none", bw)
				}
				return
			}
			if bw.IngressRate != tc.in || bw.EgressRate != tc.out {
				t.Errorf("rates = %d/%d, want %d/%d", bw.IngressRate, bw.EgressRate, tc.in, tc.out)
			}
			if tc.in > 0 && bw.IngressBurst != math.MaxUint32 || tc.out > 0 && bw.EgressBurst != math.MaxUint32 {
				t.Errorf("bursts = %d/%d, want unlimited for each given rate", bw.IngressBurst, bw.EgressBurst)
			}
		})
	}
}
