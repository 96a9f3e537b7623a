package server

import (
	"math"
	"strconv"
	"strings"

	"github.com/pinrt/pinrt/sandbox"
)

// kubelet passes a pod's traffic shaping as annotations holding resource
// quantities in bits per second.
const (
	annotationIngressBandwidth = "kubernetes.io/ingress-bandwidth"
	annotationEgressBandwidth  = "kubernetes.io/egress-bandwidth"
)

// podBandwidth reads the bandwidth annotations. As in containerd, the
// burst is left unlimited: kubelet gives no burst, and the bandwidth
// plugin needs one.
func podBandwidth(ann map[string]string) (*sandbox.Bandwidth, error) {
	in, out := ann[annotationIngressBandwidth], ann[annotationEgressBandwidth]
	if in == "" && out == "" {
		return nil, nil
	}
	bw := &sandbox.Bandwidth{}
	for _, a := range []struct {
		key, val    string
		rate, burst *uint64
	}{
		{annotationIngressBandwidth, in, &bw.IngressRate, &bw.IngressBurst},
		{annotationEgressBandwidth, out, &bw.EgressRate, &bw.EgressBurst},
	} {
		if a.val == "" {
			continue
		}
		v, err := parseQuantity(a.val)
		if err != nil || v == 0 {
			return nil, invalid("annotation %s=%q is not a positive bandwidth", a.key, a.val)
		}
		*a.rate, *a.burst = v, math.MaxUint32
	}
	return bw, nil
}

// parseQuantity parses the integer forms of a Kubernetes resource
// quantity: a number with an optional decimal (k, M, G, T) or binary
// (Ki, Mi, Gi, Ti) suffix.
func parseQuantity(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if n > math.MaxUint64/mult {
		return 0, strconv.ErrRange
	}
	return n * mult, nil
}
