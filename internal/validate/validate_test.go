package validate

import (
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func check(t *testing.T, err error, ok bool, sub string) {
	t.Helper()
	if ok {
		if err != nil {
			t.Errorf("= %v, want nil", err)
		}
		return
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), sub) {
		t.Errorf("= %v, want InvalidArgument containing %q", err, sub)
	}
}

func TestID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{strings.Repeat("ab", 32), true},
		{"a.b_c-d", true},
		{"", false}, {".", false}, {"..", false}, {"a..b", false}, {"-x", false}, {".x", false},
		{"a/b", false}, {"a\nb", false}, {strings.Repeat("a", 129), false},
	} {
		t.Run(tc.id, func(t *testing.T) { check(t, ID("", tc.id), tc.ok, "invalid ID") })
	}
}

func TestIDNamesItsKind(t *testing.T) {
	err := ID("sandbox", "../x")
	want := `invalid sandbox ID "../x": must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$ and not contain "..": invalid argument`
	if err == nil || err.Error() != want {
		t.Errorf("ID = %v, want %q", err, want)
	}
}

func TestName(t *testing.T) {
	for _, tc := range []struct {
		v   string
		ok  bool
		sub string
	}{
		{"web_1", true, ""}, {"x.y", true, ""},
		{"", false, "must not be empty"},
		{strings.Repeat("n", 254), false, "longer than 253"},
		{"a/b", false, "must not contain"}, {`a\b`, false, "must not contain"}, {"..", false, "must not contain"},
		{"a\nb", false, "must not contain"}, {"a\x00b", false, "must not contain"}, {"a\tb", false, "must not contain"},
	} {
		t.Run(tc.v, func(t *testing.T) { check(t, Name("pod name", tc.v), tc.ok, tc.sub) })
	}
}

func TestHostname(t *testing.T) {
	for _, tc := range []struct {
		v  string
		ok bool
	}{
		{"web", true}, {"web-0.svc.cluster", true}, {"Web1", true}, {strings.Repeat("a", 63), true},
		{"", false}, {strings.Repeat("a", 64), false}, {strings.Repeat("a.", 32) + "a", false},
		{"a b", false}, {"a\n1.2.3.4 evil", false}, {"-a", false}, {"a-", false}, {"a..b", false},
		{".a", false}, {"a_b", false}, {"a/b", false},
		// kubelet's FQDN with an empty clusterDomain; one root dot only.
		{"web-0.t.ns.svc.", true}, {"a..", false}, {".", false},
	} {
		t.Run(tc.v, func(t *testing.T) { check(t, Hostname(tc.v), tc.ok, "hostname") })
	}
}

func TestDNS(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		servers, searches, options []string
		ok                         bool
		sub                        string
	}{
		{"kubelet's", []string{"10.96.0.10"}, []string{"ns.svc.cluster.local", "svc.cluster.local"}, []string{"ndots:5"}, true, ""},
		{"ipv6 server", []string{"fd00::a", "fe80::1%eth0"}, nil, nil, true, ""},
		{"server hostname", []string{"dns.example"}, nil, nil, false, `DNS server "dns.example" is not an IP address`},
		{"server with option", []string{"1.1.1.1 options"}, nil, nil, false, "is not an IP address"},
		{"four servers", []string{"1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"}, nil, nil, false, "4 DNS servers"},
		{"newline in option", nil, nil, []string{"ndots:5\nnameserver 6.6.6.6"}, false, "DNS option"},
		{"space in search", nil, []string{"a b"}, nil, false, "DNS search domain"},
		{"tab in search", nil, []string{"a\tb"}, nil, false, "DNS search domain"},
		{"CR in option", nil, nil, []string{"rotate\r"}, false, "DNS option"},
		{"empty option", nil, nil, []string{""}, false, "is empty"},
		{"33 searches", nil, make([]string, 33), nil, false, "33 DNS search domains"},
	} {
		t.Run(tc.name, func(t *testing.T) { check(t, DNS(tc.servers, tc.searches, tc.options), tc.ok, tc.sub) })
	}
}

func TestPortMapping(t *testing.T) {
	for _, tc := range []struct {
		name      string
		proto     string
		ctr, host int32
		hostIP    string
		ok        bool
		sub       string
	}{
		{"tcp no host port", "tcp", 80, 0, "", true, ""},
		{"udp host port", "udp", 53, 5353, "127.0.0.1", true, ""},
		{"sctp ipv6", "sctp", 1, 65535, "::1", true, ""},
		{"unknown protocol", "7", 80, 0, "", false, `protocol "7"`},
		{"container port 0", "tcp", 0, 0, "", false, "container port 0"},
		{"container port too big", "tcp", 65536, 0, "", false, "container port 65536"},
		{"negative host port", "tcp", 80, -1, "", false, "host port -1"},
		{"host port too big", "tcp", 80, 70000, "", false, "host port 70000"},
		{"host_ip not an IP", "tcp", 80, 8080, "localhost", false, `host_ip "localhost"`},
	} {
		t.Run(tc.name, func(t *testing.T) { check(t, PortMapping(tc.proto, tc.ctr, tc.host, tc.hostIP), tc.ok, tc.sub) })
	}
}

func TestLabelsAndAnnotations(t *testing.T) {
	big := strings.Repeat("v", MaxMetadataBytes/2)
	for _, tc := range []struct {
		name        string
		labels, ann map[string]string
		ok          bool
	}{
		{"none", nil, nil, true},
		{"kubelet's", map[string]string{"io.kubernetes.pod.name": "web"}, map[string]string{"kubernetes.io/config.seen": "2024"}, true},
		{"exactly the limit", map[string]string{"": big}, map[string]string{"": big}, true},
		{"one byte over, split", map[string]string{"k": big}, map[string]string{"": big}, false},
		{"1 MB of annotations", nil, map[string]string{"a": strings.Repeat("x", 1<<20)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, LabelsAndAnnotations("pod", tc.labels, tc.ann), tc.ok, "pod labels and annotations are")
		})
	}
}

func TestNoNUL(t *testing.T) {
	check(t, NoNUL("argument", "sleep", "1"), true, "")
	check(t, NoNUL("argument"), true, "")
	check(t, NoNUL("argument", "sleep", "1\x002"), false, `argument "1\x002" contains a NUL byte`)
}

func TestCNIArg(t *testing.T) {
	check(t, CNIArg("pod name", "nginx-7c5d.x_y"), true, "")
	for _, v := range []string{"=", "a=b", "a;b", ";IgnoreUnknown=1"} {
		check(t, CNIArg("pod name", v), false, "must not contain ';' or '='")
	}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		p   string
		ok  bool
		sub string
	}{
		{"/var/log/pods/ns_pod_uid/c/0.log", true, ""},
		{"/" + strings.Repeat("a", 255) + "/b", true, ""},
		{strings.Repeat("/a", 2047), true, ""},
		{"/" + strings.Repeat("a", 256), false, "component of 256 bytes"},
		{strings.Repeat("/a", 2048), false, "4096 bytes long"},
		{"/a\x00b", false, "NUL"},
	} {
		check(t, Path("log path", tc.p), tc.ok, tc.sub)
	}
}
