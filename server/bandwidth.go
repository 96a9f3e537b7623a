package server

import (
	"math"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/pinrt/pinrt/sandbox"
)

// kubelet passes a pod's traffic shaping as annotations holding resource
// quantities in bits per second.
const (
	annotationIngressBandwidth = "kubernetes.io/ingress-bandwidth"
	annotationEgressBandwidth  = "kubernetes.io/egress-bandwidth"
)

// The bounds of a bandwidth, as containerd and kubelet's old kubenet
// had them: 1 kbit/s to 1 Pbit/s.
var (
	minBandwidth = resource.MustParse("1k")
	maxBandwidth = resource.MustParse("1P")
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
		v, err := parseBandwidth(a.val)
		if err != nil {
			return nil, invalid("annotation %s=%q is not a bandwidth from 1k to 1P", a.key, a.val)
		}
		*a.rate, *a.burst = v, math.MaxUint32
	}
	return bw, nil
}

// parseBandwidth parses a Kubernetes resource quantity ("10M", "1.5M",
// "1Gi", "25e6"), as containerd does, rounded up to whole bits.
func parseBandwidth(s string) (uint64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, err
	}
	if q.Cmp(minBandwidth) < 0 || q.Cmp(maxBandwidth) > 0 {
		return 0, resource.ErrFormatWrong
	}
	return uint64(q.Value()), nil //nolint:gosec // within 1k..1P
}
