// Package validate holds pinrt's one copy of each rule for untrusted
// identifiers and free-form request values: IDs that become path
// components, names that become reservation keys and log fields, and the
// values written into the files a pod's containers read (hostname,
// resolv.conf). Every package checks against these functions; a second
// copy of a rule drifts (pinrt once had five ID validators that disagreed
// about "..").
//
// Every error wraps errdefs.ErrInvalidArgument.
package validate

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"unicode"

	"github.com/containerd/errdefs"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// idPattern is runc's rule for container IDs (factory_linux.go) with a
// length bound: the first character can be neither '.' nor '-', so ".",
// ".." and option-like names are impossible.
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

// ID refuses an ID that is unsafe as a path component, a runtime or CNI
// container ID, or a cache file name. what names the kind of ID in the
// message ("sandbox", "container"); it may be empty.
func ID(what, id string) error {
	if !idPattern.MatchString(id) || strings.Contains(id, "..") {
		if what != "" {
			what += " "
		}
		return invalid("invalid %sID %q: must match %s and not contain \"..\"", what, id, idPattern)
	}
	return nil
}

// MaxNameLen bounds a pod or container name, namespace or uid: 253 is the
// API server's bound for a DNS subdomain, the longest of them.
const MaxNameLen = 253

// Name refuses a pod or container name, namespace or uid that would be
// unsafe in a path or a log line. what names the field in the message.
func Name(what, v string) error {
	switch {
	case v == "":
		return invalid("%s must not be empty", what)
	case len(v) > MaxNameLen:
		return invalid("%s is longer than %d characters", what, MaxNameLen)
	case strings.ContainsAny(v, "/\\") || strings.Contains(v, "..") || hasControl(v):
		return invalid("%s %q must not contain '/', '\\', '..' or control characters", what, v)
	}
	return nil
}

// CNIArg refuses a value pinrt passes to the CNI plugins in CNI_ARGS (a
// pod's name, namespace and uid): that variable is "K=V;K=V", so a ';' or
// '=' in a value would make every plugin refuse the whole list.
func CNIArg(what, v string) error {
	if strings.ContainsAny(v, ";=") {
		return invalid("%s %q must not contain ';' or '='", what, v)
	}
	return nil
}

// Linux's PATH_MAX and NAME_MAX: a path the kernel is given holds at most
// PATH_MAX bytes with its NUL, and each of its components NAME_MAX.
const (
	maxPathLen = 4096
	maxNameLen = 255
)

// Path refuses a path the kernel would refuse to create or open whatever
// the file system: one with a NUL, one too long, one with a component too
// long. The error would otherwise come from mkdir or runc, as a failure
// of the runtime rather than of the request.
func Path(what, p string) error {
	if err := NoNUL(what, p); err != nil {
		return err
	}
	if len(p) >= maxPathLen {
		return invalid("%s is %d bytes long, more than the kernel's %d", what, len(p), maxPathLen-1)
	}
	for _, c := range strings.Split(p, "/") {
		if len(c) > maxNameLen {
			return invalid("%s has a component of %d bytes, more than the kernel's %d", what, len(c), maxNameLen)
		}
	}
	return nil
}

// MaxHostnameLen is the kernel's HOST_NAME_MAX: sethostname refuses more.
const MaxHostnameLen = 64

// Hostname checks a pod hostname: a DNS name (RFC 1123 labels of letters,
// digits and '-', not starting or ending with '-', joined by dots, and
// maybe a root dot at the end) that the kernel accepts. It ends up in
// /etc/hostname and /etc/hosts, so a space or newline would add entries
// there. kubelet sends an FQDN that ends in a dot for setHostnameAsFQDN
// when its clusterDomain is empty, which containerd and CRI-O run.
func Hostname(v string) error {
	if v == "" || len(v) > MaxHostnameLen {
		return invalid("hostname %q must be 1 to %d characters", v, MaxHostnameLen)
	}
	for _, l := range strings.Split(strings.TrimSuffix(v, "."), ".") {
		if err := dnsLabel(l); err != nil {
			return invalid("hostname %q is not a DNS name: %v", v, err)
		}
	}
	return nil
}

func dnsLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q must be 1 to 63 characters", l)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with '-'", l)
	}
	if i := strings.IndexFunc(l, func(r rune) bool { return !HostnameChar(r) }); i >= 0 {
		return fmt.Errorf("label %q has the character %q", l, l[i])
	}
	return nil
}

// HostnameChar says whether r may appear in a hostname: a letter, a digit,
// '-' or the '.' between labels.
func HostnameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.'
}

// Limits of a DNS config: glibc reads at most 3 nameservers; the others
// bound what a pod's resolv.conf (and a status response) can hold.
const (
	MaxDNSServers  = 3
	MaxDNSSearches = 32
	MaxDNSOptions  = 32
	maxDNSToken    = 253
)

// DNS checks a pod's resolver config before it becomes resolv.conf
// lines. Servers must be IP addresses and searches and options single
// tokens: "ndots:5\nnameserver 6.6.6.6" as an option would otherwise add
// a nameserver line.
func DNS(servers, searches, options []string) error {
	switch {
	case len(servers) > MaxDNSServers:
		return invalid("%d DNS servers, at most %d are used", len(servers), MaxDNSServers)
	case len(searches) > MaxDNSSearches:
		return invalid("%d DNS search domains, at most %d allowed", len(searches), MaxDNSSearches)
	case len(options) > MaxDNSOptions:
		return invalid("%d DNS options, at most %d allowed", len(options), MaxDNSOptions)
	}
	for _, s := range servers {
		if _, err := netip.ParseAddr(s); err != nil {
			return invalid("DNS server %q is not an IP address", s)
		}
	}
	for _, s := range searches {
		if err := token(s); err != nil {
			return invalid("DNS search domain %q %v", s, err)
		}
	}
	for _, o := range options {
		if err := token(o); err != nil {
			return invalid("DNS option %q %v", o, err)
		}
	}
	return nil
}

// token is one word of a resolv.conf line.
func token(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("is empty")
	case len(s) > maxDNSToken:
		return fmt.Errorf("is longer than %d characters", maxDNSToken)
	case strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("must be one word without whitespace or control characters")
	}
	return nil
}

// PortMapping checks one CRI port mapping: protocol is the lower-case
// name ("tcp", "udp", "sctp"), the container port must be a real port and
// the host port 0 (no host port) or a real port; hostIP is empty or an IP.
func PortMapping(protocol string, containerPort, hostPort int32, hostIP string) error {
	switch protocol {
	case "tcp", "udp", "sctp":
	default:
		return invalid("port mapping protocol %q is not TCP, UDP or SCTP", protocol)
	}
	if containerPort < 1 || containerPort > 65535 {
		return invalid("container port %d is outside 1-65535", containerPort)
	}
	if hostPort < 0 || hostPort > 65535 {
		return invalid("host port %d is outside 1-65535 (0 means none)", hostPort)
	}
	if hostIP != "" {
		if _, err := netip.ParseAddr(hostIP); err != nil {
			return invalid("port mapping host_ip %q is not an IP address", hostIP)
		}
	}
	return nil
}

// SysctlValue refuses a value that would write more than one value:
// procfs takes a newline as the end of the value, and a NUL cuts it.
func SysctlValue(name, v string) error {
	if strings.ContainsAny(v, "\n\r\x00") {
		return invalid("sysctl %q: value %q contains a newline or NUL", name, v)
	}
	return nil
}

// NoNUL refuses a string with a NUL byte: it cannot reach the kernel as
// a path, an argument or an environment variable, and the OCI runtime
// would fail only when it starts the container. what names the value.
func NoNUL(what string, vs ...string) error {
	for _, v := range vs {
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("%s %q contains a NUL byte", what, v)
		}
	}
	return nil
}

func hasControl(s string) bool {
	return strings.IndexFunc(s, unicode.IsControl) >= 0
}

// MaxMetadataBytes bounds the labels plus annotations of one pod or
// container, keys and values together: the API server's bound for a
// pod's annotations (256 KiB). They are returned in every List response,
// and twenty pods with 1 MB of annotations each once made every
// ListPodSandbox exceed the gRPC message limit.
const MaxMetadataBytes = 256 << 10

// LabelsAndAnnotations bounds the size of an object's labels and
// annotations together. what names the object ("pod", "container").
func LabelsAndAnnotations(what string, labels, annotations map[string]string) error {
	n := 0
	for _, m := range []map[string]string{labels, annotations} {
		for k, v := range m {
			n += len(k) + len(v)
		}
	}
	if n > MaxMetadataBytes {
		return invalid("%s labels and annotations are %d bytes, at most %d allowed", what, n, MaxMetadataBytes)
	}
	return nil
}
